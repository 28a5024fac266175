// Fenced-code splitting for message rendering (``` and ~~~ fences, CommonMark-style:
// a fence closes with the same character and at least as many of them), and the prose's
// rendering to HTML through QTextDocument's Markdown reader.
#include "markdown_blocks.h"

#include <QRegularExpression>
#include <QTextBlock>
#include <QTextCursor>
#include <QTextDocument>
#include <QTextList>

namespace granule::app {
namespace {

// Length of the fence run at the start of `line` (after up to 3 spaces), or 0.
int fenceLength(const QString& line, QChar* fence_char) {
  int i = 0;
  while (i < 3 && i < line.size() && line[i] == QLatin1Char(' ')) ++i;
  if (i >= line.size() || (line[i] != QLatin1Char('`') && line[i] != QLatin1Char('~'))) return 0;
  const QChar c = line[i];
  int n = 0;
  while (i + n < line.size() && line[i + n] == c) ++n;
  if (n < 3) return 0;
  *fence_char = c;
  return n;
}

// Walks the fences: calls `part(text, is_code, info)` for every part in order.
template <typename PartFn>
void walkFences(const QString& markdown, PartFn part) {
  QStringList current;  // lines of the part being collected
  bool in_code = false;
  QChar open_char;
  int open_length = 0;
  QString info;
  for (const QString& line : markdown.split(QLatin1Char('\n'))) {
    QChar fence_char;
    const int fence = fenceLength(line, &fence_char);
    const bool opens = !in_code && fence > 0;
    const bool closes = in_code && fence >= open_length && fence_char == open_char &&
                        line.trimmed().size() == fence;
    if (opens || closes) {
      part(current.join(QLatin1Char('\n')), in_code, info);
      current.clear();
      in_code = opens;
      open_char = fence_char;
      open_length = fence;
      if (opens) info = line.trimmed().mid(fence).trimmed();
      continue;
    }
    current.append(line);
  }
  part(current.join(QLatin1Char('\n')), in_code, info);
}

bool isTableRow(const QString& trimmed) { return trimmed.startsWith(QLatin1Char('|')); }

}  // namespace

QStringList splitMarkdownCodeBlocks(const QString& markdown) {
  QStringList parts;
  walkFences(markdown, [&](const QString& text, bool, const QString&) { parts.append(text); });
  // Prose keeps its surrounding blank lines out of the layout; code keeps its indentation.
  for (qsizetype i = 0; i < parts.size(); i += 2) parts[i] = parts[i].trimmed();
  return parts;
}

QStringList markdownCodeLanguages(const QString& markdown) {
  QStringList languages;
  walkFences(markdown, [&](const QString&, bool is_code, const QString& info) {
    if (is_code) languages.append(info.section(QLatin1Char(' '), 0, 0));
  });
  return languages;
}

QString keepMarkdownLineBreaks(const QString& prose) {
  // A Markdown hard break ("  \n") becomes a new block in QTextDocument's reader, which
  // would space a poem's lines like paragraphs; a line separator keeps them in one block.
  static const QRegularExpression starts_block(QStringLiteral(
      R"(^(\s{0,3}([-*+]\s|\d{1,9}[.)]\s|>|#|\||```|~~~|={3,}\s*$|-{3,}\s*$|\*{3,}\s*$)|\s{4}))"));
  const QStringList lines = prose.split(QLatin1Char('\n'));
  QString out;
  for (qsizetype i = 0; i < lines.size(); ++i) {
    out += lines[i];
    if (i + 1 == lines.size()) break;
    const QString here = lines[i].trimmed();
    const QString& next = lines[i + 1];
    const bool joins = !here.isEmpty() && !next.trimmed().isEmpty() &&
                       !here.startsWith(QLatin1Char('#')) && !isTableRow(here) &&
                       !starts_block.match(next).hasMatch();
    if (joins) {
      // Trailing spaces or a backslash (Markdown's own hard breaks) go with the newline.
      while (out.endsWith(QLatin1Char(' '))) out.chop(1);
      if (out.endsWith(QLatin1Char('\\'))) out.chop(1);
      out += QChar(QChar::LineSeparator);
    } else {
      out += QLatin1Char('\n');
    }
  }
  return out;
}

QString markdownProseToHtml(const QString& prose, const MarkdownStyle& style) {
  QTextDocument doc;
  doc.setMarkdown(keepMarkdownLineBreaks(prose), QTextDocument::MarkdownDialectGitHub);

  QTextCursor cursor(&doc);
  cursor.beginEditBlock();
  const QTextBlock last = doc.lastBlock();
  for (QTextBlock block = doc.begin(); block.isValid(); block = block.next()) {
    QTextBlockFormat format = block.blockFormat();
    const bool first = block == doc.begin();
    const bool is_last = block == last;
    if (format.headingLevel() > 0) {
      format.setTopMargin(first ? 0 : style.heading_spacing);
      format.setBottomMargin(style.paragraph_spacing / 2);
    } else if (QTextList* list = block.textList()) {
      // Items sit close together; the list as a whole is spaced like a paragraph.
      const bool last_item = list->itemNumber(block) == list->count() - 1;
      format.setTopMargin(first || list->itemNumber(block) > 0 ? 2 : style.paragraph_spacing / 2);
      format.setBottomMargin(last_item && !is_last ? style.paragraph_spacing : 2);
    } else {
      format.setTopMargin(0);
      format.setBottomMargin(is_last ? 0 : style.paragraph_spacing);
    }
    QTextCursor at(block);
    at.setBlockFormat(format);

    for (auto it = block.begin(); !it.atEnd(); ++it) {
      const QTextFragment fragment = it.fragment();
      if (!fragment.isValid()) continue;
      QTextCharFormat chars = fragment.charFormat();
      bool changed = false;
      if (chars.isAnchor() && !chars.anchorHref().isEmpty()) {
        chars.setForeground(style.link);
        chars.setFontUnderline(true);
        changed = true;
      }
      if (chars.fontFixedPitch() || chars.fontFamilies().toStringList().contains(
                                        QStringLiteral("monospace"), Qt::CaseInsensitive)) {
        chars.setBackground(style.code_background);
        chars.setFontFamilies({style.mono_family});
        chars.setFontFixedPitch(true);
        // The view's size applies (the reader sets the system's fixed font size).
        chars.clearProperty(QTextFormat::FontPointSize);
        chars.clearProperty(QTextFormat::FontPixelSize);
        changed = true;
      }
      if (!changed) continue;
      QTextCursor span(&doc);
      span.setPosition(fragment.position());
      span.setPosition(fragment.position() + fragment.length(), QTextCursor::KeepAnchor);
      span.setCharFormat(chars);
    }
  }
  cursor.endEditBlock();

  QString html = doc.toHtml();
  // The body's font and size would override the view's font: drop them.
  static const QRegularExpression body_style(QStringLiteral("<body style=\"[^\"]*\">"));
  html.replace(body_style, QStringLiteral("<body>"));
  return html;
}

QString Markdown::html(const QString& prose, const QColor& link, const QColor& codeBackground,
                       const QString& monoFamily) const {
  MarkdownStyle style;
  style.link = link;
  style.code_background = codeBackground;
  style.mono_family = monoFamily;
  return markdownProseToHtml(prose, style);
}

QString Markdown::codeLanguage(const QString& markdown, int block) const {
  const QStringList languages = markdownCodeLanguages(markdown);
  return block >= 0 && block < languages.size() ? languages[block] : QString();
}

}  // namespace granule::app
