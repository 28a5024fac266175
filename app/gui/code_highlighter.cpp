// The code blocks' highlighter: language tables and a one-pass scanner per line.
#include "code_highlighter.h"

#include <QTextDocument>

namespace granule::app {
namespace {

QSet<QString> words(const char* list) {
  QSet<QString> set;
  for (const QString& w : QString::fromLatin1(list).split(QLatin1Char(' '), Qt::SkipEmptyParts))
    set.insert(w);
  return set;
}

enum CommentStyle { kCLike, kHash, kHashAtWordStart, kNone };

// One row per language: the info strings that name it (its canonical name first), how its
// comments start, whether it has Python's triple-quoted strings, its keywords and its types.
struct LanguageRow {
  const char* names;
  CommentStyle comments;
  bool triple_quotes;
  const char* keywords;
  const char* types;
};

constexpr LanguageRow kLanguages[] = {
    {"cpp c c++ cc cxx h hpp cuda cu", kCLike, false,
     "alignas alignof auto break case catch class const consteval constexpr constinit "
     "const_cast continue co_await co_return co_yield decltype default delete do "
     "dynamic_cast else enum explicit export extern for friend goto if inline mutable "
     "namespace new noexcept operator private protected public register "
     "reinterpret_cast return sizeof static static_assert static_cast struct switch "
     "template this throw try typedef typeid typename union using virtual volatile "
     "while #include #define #pragma #if #ifdef #ifndef #endif #else #elif",
     "bool char char8_t char16_t char32_t double float int long short signed unsigned "
     "void wchar_t size_t int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t "
     "uint64_t true false nullptr NULL std"},
    {"python py python3", kHash, true,
     "and as assert async await break class continue def del elif else except finally "
     "for from global if import in is lambda nonlocal not or pass raise return try "
     "while with yield match case",
     "True False None self int float str bool list dict set tuple bytes object print "
     "len range"},
    {"javascript js jsx typescript ts tsx mjs node", kCLike, false,
     "abstract as async await break case catch class const continue debugger default "
     "delete do else enum export extends finally for from function get if implements "
     "import in instanceof interface let new of private protected public readonly "
     "return set static super switch this throw try type typeof var void while with "
     "yield",
     "true false null undefined NaN Infinity number string boolean any unknown never "
     "object console"},
    {"rust rs", kCLike, false,
     "as async await break const continue crate dyn else enum extern fn for if impl in "
     "let loop match mod move mut pub ref return self Self static struct super trait "
     "type unsafe use where while macro_rules",
     "true false i8 i16 i32 i64 i128 isize u8 u16 u32 u64 u128 usize f32 f64 bool char "
     "str String Vec Option Some None Result Ok Err Box"},
    {"go golang", kCLike, false,
     "break case chan const continue default defer else fallthrough for func go goto "
     "if import interface map package range return select struct switch type var",
     "true false nil iota bool byte complex64 complex128 error float32 float64 int "
     "int8 int16 int32 int64 rune string uint uint8 uint16 uint32 uint64 uintptr make "
     "len cap append new panic"},
    {"java kotlin", kCLike, false,
     "abstract assert break case catch class const continue default do else enum "
     "extends final finally for goto if implements import instanceof interface native "
     "new package private protected public record return static strictfp super switch "
     "synchronized this throw throws transient try var void volatile while",
     "true false null boolean byte char double float int long short String Object "
     "Integer List Map"},
    {"bash sh shell zsh console shellsession", kHashAtWordStart, false,
     "if then else elif fi for while until do done case esac in function return local "
     "export readonly declare select break continue exit",
     "echo cd ls cat grep sed awk printf read set unset source sudo apt-get cmake make "
     "git true false"},
    {"json jsonc json5", kNone, false, "", "true false null"},
};

CodeLanguage languageOf(const LanguageRow& row) {
  CodeLanguage l;
  l.known = true;
  l.name = QString::fromLatin1(row.names).section(QLatin1Char(' '), 0, 0);
  l.keywords = words(row.keywords);
  l.types = words(row.types);
  if (row.comments == kCLike) {
    l.line_comment = QStringLiteral("//");
    l.block_open = QStringLiteral("/*");
    l.block_close = QStringLiteral("*/");
  } else if (row.comments != kNone) {
    l.line_comment = QStringLiteral("#");
    l.hash_needs_space = row.comments == kHashAtWordStart;
  }
  l.triple_quotes = row.triple_quotes;
  return l;
}

bool isIdentifierStart(QChar c) { return c.isLetter() || c == QLatin1Char('_'); }
bool isIdentifierPart(QChar c) { return c.isLetterOrNumber() || c == QLatin1Char('_'); }

}  // namespace

CodeLanguage codeLanguageFor(const QString& info) {
  // The info string's first word names the language ("python title=x.py" → python).
  const QString name = info.trimmed().section(QLatin1Char(' '), 0, 0).toLower();
  for (const LanguageRow& row : kLanguages) {
    if (QString::fromLatin1(row.names).split(QLatin1Char(' ')).contains(name))
      return languageOf(row);
  }
  CodeLanguage unknown;
  unknown.name = name;
  return unknown;
}

CodeColors CodeColors::forScheme(bool dark) {
  // One Dark / One Light: readable on the theme's code background in either scheme.
  if (dark)
    return {QColor(0xc6, 0x78, 0xdd), QColor(0xe5, 0xc0, 0x7b), QColor(0x98, 0xc3, 0x79),
            QColor(0x7f, 0x84, 0x8e), QColor(0xd1, 0x9a, 0x66)};
  return {QColor(0xa6, 0x26, 0xa4), QColor(0x98, 0x68, 0x01), QColor(0x50, 0xa1, 0x4f),
          QColor(0x8a, 0x8c, 0x94), QColor(0xb7, 0x6b, 0x01)};
}

SyntaxHighlighter::SyntaxHighlighter(QTextDocument* document, CodeLanguage language,
                                     CodeColors colors)
    : QSyntaxHighlighter(document), language_(std::move(language)), colors_(colors) {
  buildFormats();
}

void SyntaxHighlighter::setColors(CodeColors colors) {
  colors_ = colors;
  buildFormats();
  rehighlight();
}

void SyntaxHighlighter::setLanguage(CodeLanguage language) {
  language_ = std::move(language);
  rehighlight();
}

void SyntaxHighlighter::buildFormats() {
  keyword_.setForeground(colors_.keyword);
  type_.setForeground(colors_.type);
  string_.setForeground(colors_.string);
  comment_.setForeground(colors_.comment);
  comment_.setFontItalic(true);
  number_.setForeground(colors_.number);
}

void SyntaxHighlighter::highlightBlock(const QString& text) {
  setCurrentBlockState(Normal);
  if (!language_.known) return;
  const qsizetype n = text.size();
  qsizetype i = 0;

  // A construct left open by the previous line.
  const int carried = previousBlockState();
  if (carried == InBlockComment || carried == InTripleDouble || carried == InTripleSingle) {
    const QString close = carried == InBlockComment   ? language_.block_close
                          : carried == InTripleDouble ? QStringLiteral("\"\"\"")
                                                      : QStringLiteral("'''");
    const qsizetype end = text.indexOf(close);
    if (end < 0) {
      setFormat(0, static_cast<int>(n), carried == InBlockComment ? comment_ : string_);
      setCurrentBlockState(carried);
      return;
    }
    i = end + close.size();
    setFormat(0, static_cast<int>(i), carried == InBlockComment ? comment_ : string_);
  }

  while (i < n) {
    const QChar c = text[i];
    // Line comment.
    if (!language_.line_comment.isEmpty() &&
        QStringView(text).mid(i).startsWith(language_.line_comment) &&
        (!language_.hash_needs_space || i == 0 || text[i - 1].isSpace())) {
      setFormat(static_cast<int>(i), static_cast<int>(n - i), comment_);
      return;
    }
    // Block comment.
    if (!language_.block_open.isEmpty() &&
        QStringView(text).mid(i).startsWith(language_.block_open)) {
      const qsizetype end = text.indexOf(language_.block_close, i + language_.block_open.size());
      if (end < 0) {
        setFormat(static_cast<int>(i), static_cast<int>(n - i), comment_);
        setCurrentBlockState(InBlockComment);
        return;
      }
      const qsizetype stop = end + language_.block_close.size();
      setFormat(static_cast<int>(i), static_cast<int>(stop - i), comment_);
      i = stop;
      continue;
    }
    // Python's triple-quoted strings.
    if (language_.triple_quotes && (c == QLatin1Char('"') || c == QLatin1Char('\'')) &&
        QStringView(text).mid(i).startsWith(QString(3, c))) {
      const QString quotes(3, c);
      const qsizetype end = text.indexOf(quotes, i + 3);
      if (end < 0) {
        setFormat(static_cast<int>(i), static_cast<int>(n - i), string_);
        setCurrentBlockState(c == QLatin1Char('"') ? InTripleDouble : InTripleSingle);
        return;
      }
      setFormat(static_cast<int>(i), static_cast<int>(end + 3 - i), string_);
      i = end + 3;
      continue;
    }
    // Strings: "…", '…' and `…`, with backslash escapes, ending at the line's end at most.
    // Rust's lifetimes ('a) and apostrophes in Bash words are not strings.
    const bool quote = c == QLatin1Char('"') || c == QLatin1Char('`') ||
                       (c == QLatin1Char('\'') &&
                        !(language_.name == u"rust" && i + 2 < n &&
                          text[i + 2] != QLatin1Char('\'') && isIdentifierStart(text[i + 1])));
    if (quote && !(c == QLatin1Char('`') && language_.name == u"cpp")) {
      qsizetype j = i + 1;
      while (j < n && text[j] != c) j += text[j] == QLatin1Char('\\') ? 2 : 1;
      const qsizetype stop = std::min(n, j + 1);
      setFormat(static_cast<int>(i), static_cast<int>(stop - i), string_);
      i = stop;
      continue;
    }
    // Numbers: 42, 3.14, 1e-3, 0x1F, 10_000, 2.5f, 1u — not the digits inside a name.
    if (c.isDigit() || (c == QLatin1Char('.') && i + 1 < n && text[i + 1].isDigit() &&
                        (i == 0 || !isIdentifierPart(text[i - 1])))) {
      qsizetype j = i + 1;
      while (j < n && (text[j].isLetterOrNumber() || text[j] == QLatin1Char('_') ||
                       text[j] == QLatin1Char('.') ||
                       ((text[j] == QLatin1Char('-') || text[j] == QLatin1Char('+')) &&
                        (text[j - 1] == QLatin1Char('e') || text[j - 1] == QLatin1Char('E')) &&
                        !text.mid(i, 2).startsWith(QLatin1String("0x")))))
        ++j;
      setFormat(static_cast<int>(i), static_cast<int>(j - i), number_);
      i = j;
      continue;
    }
    // Words: keywords and builtin types. C's preprocessor words keep their '#'.
    if (isIdentifierStart(c) || (c == QLatin1Char('#') && language_.name == u"cpp")) {
      qsizetype j = i + 1;
      while (j < n && isIdentifierPart(text[j])) ++j;
      const QString word = text.mid(i, j - i);
      if (language_.keywords.contains(word))
        setFormat(static_cast<int>(i), static_cast<int>(j - i), keyword_);
      else if (language_.types.contains(word))
        setFormat(static_cast<int>(i), static_cast<int>(j - i), type_);
      i = j;
      continue;
    }
    ++i;
  }
}

void CodeHighlighter::setDocument(QQuickTextDocument* document) {
  if (document == document_) return;
  document_ = document;
  rebuild();
  Q_EMIT documentChanged();
}

void CodeHighlighter::setLanguage(const QString& language) {
  if (language == language_) return;
  language_ = language;
  if (highlighter_)
    highlighter_->setLanguage(codeLanguageFor(language_));
  else
    rebuild();
  Q_EMIT languageChanged();
}

void CodeHighlighter::setDark(bool dark) {
  if (dark == dark_) return;
  dark_ = dark;
  if (highlighter_) highlighter_->setColors(CodeColors::forScheme(dark_));
  Q_EMIT darkChanged();
}

void CodeHighlighter::rebuild() {
  delete highlighter_;
  if (!document_ || !document_->textDocument()) return;
  // Owned by the document: it goes with the TextEdit.
  highlighter_ = new SyntaxHighlighter(document_->textDocument(), codeLanguageFor(language_),
                                       CodeColors::forScheme(dark_));
}

}  // namespace granule::app
