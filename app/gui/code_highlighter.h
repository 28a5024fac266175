// CodeHighlighter: a small rule-based syntax highlighter for the code blocks of messages
// (Debian 12 ships no Qt 6 build of KSyntaxHighlighting). One scanner per line handles
// keywords, strings, comments and numbers for C/C++, Python, JavaScript/TypeScript, Rust,
// Go, Java, Bash and JSON; QML attaches it to a TextEdit's textDocument.
#pragma once
#include <QtQml/qqmlregistration.h>

#include <QColor>
#include <QObject>
#include <QPointer>
#include <QQuickTextDocument>
#include <QSet>
#include <QSyntaxHighlighter>
#include <QTextCharFormat>

namespace granule::app {

// The rules of one language; `known` is false for a language the highlighter does not know
// (the block is then shown plain).
struct CodeLanguage {
  bool known = false;
  QString name;  // canonical: "cpp", "python", "javascript", "rust", "go", "java", "bash", "json"
  QSet<QString> keywords;
  QSet<QString> types;            // builtin types and literals (true, None, i32, …)
  QString line_comment;           // "//", "#", or empty
  QString block_open;             // "/*" or empty
  QString block_close;            // "*/"
  bool triple_quotes = false;     // Python's """ and ''' strings, which span lines
  bool hash_needs_space = false;  // Bash: # starts a comment only at a word's start
};

// The rules for a fence's info string ("c++", "py", "ts", "sh", …); case-insensitive.
CodeLanguage codeLanguageFor(const QString& info);

// The colours of each kind of token.
struct CodeColors {
  QColor keyword, type, string, comment, number;
  static CodeColors forScheme(bool dark);
};

class SyntaxHighlighter : public QSyntaxHighlighter {
 public:
  SyntaxHighlighter(QTextDocument* document, CodeLanguage language, CodeColors colors);
  void setColors(CodeColors colors);
  void setLanguage(CodeLanguage language);

 protected:
  void highlightBlock(const QString& text) override;

 private:
  // Block states carried to the next line.
  enum State { Normal = 0, InBlockComment = 1, InTripleDouble = 2, InTripleSingle = 3 };
  void buildFormats();

  CodeLanguage language_;
  CodeColors colors_;
  QTextCharFormat keyword_, type_, string_, comment_, number_;
};

// QML side: `CodeHighlighter { document: edit.textDocument; language: "cpp"; dark: Theme.dark }`.
class CodeHighlighter : public QObject {
  Q_OBJECT
  QML_ELEMENT
  Q_PROPERTY(QQuickTextDocument* document READ document WRITE setDocument NOTIFY documentChanged)
  Q_PROPERTY(QString language READ language WRITE setLanguage NOTIFY languageChanged)
  Q_PROPERTY(bool dark READ dark WRITE setDark NOTIFY darkChanged)
  // Whether the language is one the highlighter knows.
  Q_PROPERTY(bool known READ known NOTIFY languageChanged)

 public:
  explicit CodeHighlighter(QObject* parent = nullptr) : QObject(parent) {}

  QQuickTextDocument* document() const { return document_; }
  void setDocument(QQuickTextDocument* document);
  QString language() const { return language_; }
  void setLanguage(const QString& language);
  bool dark() const { return dark_; }
  void setDark(bool dark);
  bool known() const { return codeLanguageFor(language_).known; }

 Q_SIGNALS:
  void documentChanged();
  void languageChanged();
  void darkChanged();

 private:
  void rebuild();

  QPointer<QQuickTextDocument> document_;
  QString language_;
  bool dark_ = false;
  QPointer<SyntaxHighlighter> highlighter_;
};

}  // namespace granule::app
