// MessageModel: one chat's messages for the conversation view, including the assistant
// message being streamed. GUI thread only; ChatController keeps one per open chat.
#pragma once
#include <QtQml/qqmlregistration.h>

#include "chat_store.h"
#include "list_model.h"

namespace granule::app {

class MessageModel : public granule::app::ListModel {
  Q_OBJECT
  QML_ELEMENT
  QML_UNCREATABLE("Messages come from ChatController")
  // Tokens the chat's context holds after the last reply on this branch: its prompt plus
  // its tokens (0 before any reply).
  Q_PROPERTY(int contextTokens READ contextTokens NOTIFY contextTokensChanged)
  // The row where the model's view begins (older messages were dropped from its context),
  // or -1 when it sees the whole chat.
  Q_PROPERTY(int viewStartRow READ viewStartRow WRITE setViewStartRow NOTIFY viewStartRowChanged)

 public:
  enum Role {
    MessageIdRole = Qt::UserRole + 1,
    SpeakerRole,  // the message's role: "user", "assistant", "system"
    ContentRole,
    BlocksRole,  // splitMarkdownCodeBlocks(content)
    GeneratingRole,
    TokensPerSecondRole,
    FinishReasonRole,
    TokenCountRole,
    VersionRole,       // 1-based version of this turn
    VersionCountRole,  // versions of this turn (regenerated answers, edited questions)
    TimeToFirstTokenMsRole,
    PromptTokensRole,
    ViewStartsHereRole,  // the model's view begins at this message (see viewStartRow)
    ReasoningRole,       // the model's reasoning before its answer ("" for none)
    ReasoningMsRole,     // how long it reasoned (from its first text to its answer)
    ThinkingRole,        // generating, and still in its reasoning (no answer yet)
    // Tool use (StoredMessage::tool as an object): an assistant message's {"calls"}, a tool
    // card's {"id", "name", "server", "arguments", "state", "error"}; empty for others.
    ToolRole,
  };
  Q_ENUM(Role)

  explicit MessageModel(QObject* parent = nullptr);

  void setMessages(const QList<StoredMessage>& messages);
  const StoredMessage& message(int row) const { return rows_.at(row).stored; }
  QList<StoredMessage> messages() const;
  int append(const StoredMessage& message, bool generating = false);
  // Streaming: adds text (and reasoning) to the message at `row` and updates its tokens per
  // second; elapsed_s counts from its first text. Reasoning time runs until the answer starts.
  void appendText(int row, const QString& text, int tokens, double elapsed_s,
                  const QString& reasoning = {});
  void setTimeToFirstToken(int row, double ms);
  void setPromptTokens(int row, int tokens);
  // Continue: the finished message at `row` streams again (its text and tokens kept).
  void resume(int row);
  void finish(int row, const QString& finish_reason);
  int contextTokens() const;
  int viewStartRow() const { return view_start_row_; }
  void setViewStartRow(int row);
  void removeFrom(int row);
  // Replaces the stored message at `row` (a tool card's state and result).
  void replace(int row, const StoredMessage& message);
  // The row of the message being generated, or -1.
  int generatingRow() const;

 Q_SIGNALS:
  void contextTokensChanged();
  void viewStartRowChanged();

 private:
  struct Row {
    StoredMessage stored;
    QStringList blocks;
    bool generating = false;
    int tokens_at_start = 0;  // tokens the message had when this stream began (Continue)
    int first_chunk_tokens = 0;
  };
  int itemCount() const override { return static_cast<int>(rows_.size()); }
  QVariant value(int row, int role) const override;

  std::vector<Row> rows_;
  int view_start_row_ = -1;
};

}  // namespace granule::app
