// MessageModel: one chat's messages for the conversation view, including the assistant
// message being streamed. GUI thread only; ChatController keeps one per open chat.
#pragma once
#include <QtQml/qqmlregistration.h>

#include <QAbstractListModel>

#include "chat_store.h"

namespace granule::app {

class MessageModel : public QAbstractListModel {
  Q_OBJECT
  QML_ELEMENT
  QML_UNCREATABLE("Messages come from ChatController")
  Q_PROPERTY(int count READ count NOTIFY countChanged)

 public:
  enum Role {
    MessageIdRole = Qt::UserRole + 1,
    RoleNameRole,  // "user", "assistant", "system"
    ContentRole,
    BlocksRole,  // splitMarkdownCodeBlocks(content)
    GeneratingRole,
    TokensPerSecondRole,
    FinishReasonRole,
    TokenCountRole,
  };
  Q_ENUM(Role)

  explicit MessageModel(QObject* parent = nullptr);

  int rowCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role) const override;
  QHash<int, QByteArray> roleNames() const override;
  int count() const { return static_cast<int>(rows_.size()); }

  void setMessages(const QList<StoredMessage>& messages);
  const StoredMessage& message(int row) const { return rows_.at(row).stored; }
  QList<StoredMessage> messages() const;
  int append(const StoredMessage& message, bool generating = false);
  void setMessageId(int row, qint64 id);
  // Streaming: adds text to the message at `row` and updates its tokens per second.
  void appendText(int row, const QString& text, int tokens, double elapsed_s);
  void finish(int row, const QString& finish_reason);
  void removeFrom(int row);
  // The row of the message being generated, or -1.
  int generatingRow() const;

 Q_SIGNALS:
  void countChanged();

 private:
  struct Row {
    StoredMessage stored;
    QStringList blocks;
    bool generating = false;
    int tokens = 0;
    int first_chunk_tokens = 0;
  };
  std::vector<Row> rows_;
};

}  // namespace granule::app
