// Message Markdown for the view: splits a message at its fenced code blocks (prose is
// rendered as rich text, each code block as monospace text with its own copy button and
// highlighter), and renders prose to HTML with the theme's link and inline-code colours,
// single line breaks kept (poems) and space between paragraphs and headings.
#pragma once
#include <QtQml/qqmlregistration.h>

#include <QColor>
#include <QObject>
#include <QStringList>

namespace granule::app {

// Alternating parts: even indices are Markdown prose, odd indices are code blocks (their
// text without the fences and the info string). Empty prose between adjacent blocks is
// kept so the parity holds. An unclosed fence (a block still streaming) runs to the end.
QStringList splitMarkdownCodeBlocks(const QString& markdown);

// The info string of each fenced code block, in order (parts 1, 3, 5… of the split):
// "python", "c++", or "" for a fence without one.
QStringList markdownCodeLanguages(const QString& markdown);

// Prose with every single line break inside a paragraph made a line separator (U+2028),
// so lines written one under the other stay so (a poem) in one paragraph; blank lines, and
// lines that start a list item, quote, heading, table row, fence or rule, stay newlines.
QString keepMarkdownLineBreaks(const QString& prose);

struct MarkdownStyle {
  QColor link;
  QColor code_background;
  QString mono_family;
  // Space below a paragraph or list, above and below a heading, in pixels.
  int paragraph_spacing = 10;
  int heading_spacing = 14;
};

// Prose Markdown (no fences) as HTML for a rich-text view: the body carries no font, so
// the view's own font and colour apply.
QString markdownProseToHtml(const QString& prose, const MarkdownStyle& style);

// QML: `text: Markdown.html(prose, Theme.link, Theme.inlineCodeBackground, Theme.monoFamily)`.
class Markdown : public QObject {
  Q_OBJECT
  QML_ELEMENT
  QML_SINGLETON

 public:
  explicit Markdown(QObject* parent = nullptr) : QObject(parent) {}
  Q_INVOKABLE QString html(const QString& prose, const QColor& link, const QColor& codeBackground,
                           const QString& monoFamily) const;
  // The language of code block `block` (0-based) of a message's Markdown.
  Q_INVOKABLE QString codeLanguage(const QString& markdown, int block) const;
};

}  // namespace granule::app
