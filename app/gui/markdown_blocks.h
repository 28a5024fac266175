// Splits a message's Markdown at its fenced code blocks, so the view can render prose as
// Markdown and each code block as monospace text with its own copy button.
#pragma once
#include <QStringList>

namespace granule::app {

// Alternating parts: even indices are Markdown prose, odd indices are code blocks (their
// text without the fences and the info string). Empty prose between adjacent blocks is
// kept so the parity holds. An unclosed fence (a block still streaming) runs to the end.
QStringList splitMarkdownCodeBlocks(const QString& markdown);

}  // namespace granule::app
