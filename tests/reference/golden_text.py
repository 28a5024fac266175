"""What the tokenizer golden scripts share: the escaping of the golden text files (undone by
tests/support/test_files.cpp's unescape_golden) and where `setup.sh testdata` puts llama.cpp's
vocabulary test files."""
import os
import sys


def escape(text):
    """The text's UTF-8 with backslash, newline, tab and CR named and other controls as \\xHH."""
    named = {0x5C: b"\\\\", 0x0A: b"\\n", 0x09: b"\\t", 0x0D: b"\\r"}
    out = bytearray()
    for byte in text.encode("utf-8"):
        if byte in named:
            out += named[byte]
        elif byte < 0x20 or byte == 0x7F:
            out += b"\\x%02x" % byte
        else:
            out.append(byte)
    return out.decode("utf-8")


def vocab_test_file(name):
    """$XDG_DATA_HOME/granule/testdata/tokenizer/NAME (XDG_DATA_HOME: ~/.local/share)."""
    data_home = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return os.path.join(data_home, "granule/testdata/tokenizer", name)


def vocab_test_fields(name):
    """The GGUF metadata of sys.argv[1], or else of the vocabulary test file NAME: (path, fields)."""
    import gguf  # only the scripts that read a vocabulary need it

    path = sys.argv[1] if len(sys.argv) > 1 else vocab_test_file(name)
    return path, gguf.GGUFReader(path).fields
