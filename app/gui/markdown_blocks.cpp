// Fenced-code splitting for message rendering (``` and ~~~ fences, CommonMark-style:
// a fence closes with the same character and at least as many of them).
#include "markdown_blocks.h"

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

}  // namespace

QStringList splitMarkdownCodeBlocks(const QString& markdown) {
  QStringList parts;
  QStringList current;  // lines of the part being collected
  bool in_code = false;
  QChar open_char;
  int open_length = 0;
  for (const QString& line : markdown.split(QLatin1Char('\n'))) {
    QChar fence_char;
    const int fence = fenceLength(line, &fence_char);
    const bool opens = !in_code && fence > 0;
    const bool closes = in_code && fence >= open_length && fence_char == open_char &&
                        line.trimmed().size() == fence;
    if (opens || closes) {
      parts.append(current.join(QLatin1Char('\n')));
      current.clear();
      in_code = opens;
      open_char = fence_char;
      open_length = fence;
      continue;
    }
    current.append(line);
  }
  parts.append(current.join(QLatin1Char('\n')));
  // Prose keeps its surrounding blank lines out of the layout; code keeps its indentation.
  for (qsizetype i = 0; i < parts.size(); i += 2) parts[i] = parts[i].trimmed();
  return parts;
}

}  // namespace granule::app
