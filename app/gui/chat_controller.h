// ChatController: the chats as QML sees them — the sidebar list, the open chat's
// messages and settings, and the actions (send, stop, regenerate, edit and resend,
// rename, delete with undo, search). Turns actions into worker requests and the worker's
// signals into model updates; saves every change in the ChatStore. GUI thread only.
#pragma once
#include <QtQml/qqmlregistration.h>

#include <QElapsedTimer>
#include <QObject>
#include <QSet>
#include <QUrl>
#include <functional>
#include <map>
#include <optional>

#include "chat_store.h"
#include "conversation_list_model.h"
#include "error_reporter.h"
#include "mcp_controller.h"
#include "message_model.h"
#include "sampling_editor.h"
#include "worker_types.h"

namespace granule::app {

// A chat's title from its first message: Markdown marks removed, cut at a word boundary.
QString titleFrom(const QString& text);

class ChatController : public QObject {
  Q_OBJECT
  QML_ELEMENT
  QML_UNCREATABLE("Created by the application")
  Q_PROPERTY(granule::app::ConversationListModel* conversations READ conversations CONSTANT)
  Q_PROPERTY(granule::app::MessageModel* messages READ messages NOTIFY currentChatChanged)
  // Ids are SQLite row ids; QML sees them as numbers (exact below 2^53).
  Q_PROPERTY(double currentChatId READ currentChatIdNumber NOTIFY currentChatChanged)
  Q_PROPERTY(QString currentTitle READ currentTitle NOTIFY currentChatChanged)
  Q_PROPERTY(bool currentGenerating READ currentGenerating NOTIFY generatingChanged)
  Q_PROPERTY(int generatingCount READ generatingCount NOTIFY generatingChanged)
  Q_PROPERTY(bool modelReady READ modelReady WRITE setModelReady NOTIFY modelReadyChanged)
  Q_PROPERTY(QString searchText READ searchText WRITE setSearchText NOTIFY searchTextChanged)
  Q_PROPERTY(QString deletedTitle READ deletedTitle NOTIFY undoChanged)
  // The open chat's settings.
  Q_PROPERTY(QString systemPrompt READ systemPrompt WRITE setSystemPrompt NOTIFY settingsChanged)
  Q_PROPERTY(granule::app::SamplingEditor* sampling READ samplingEditor CONSTANT)
  // Where the open chat runs: "" the loaded model, "URL#model" a model on an endpoint
  // (EndpointsController). A change applies from the next answer; new chats start on the
  // engine chosen last.
  Q_PROPERTY(QString currentEngine READ currentEngine WRITE setCurrentEngine NOTIFY settingsChanged)
  // The MCP servers whose tools the chats offer the model (null when none are wired).
  Q_PROPERTY(granule::app::McpController* tools READ tools CONSTANT)

 public:
  static inline const QString kDefaultTitle = QStringLiteral("New chat");

  ChatController(ChatStore& store, ErrorReporter& errors, QObject* parent = nullptr);

  ConversationListModel* conversations() { return &conversations_; }
  MessageModel* messages();
  MessageModel* messagesOf(qint64 chat_id);
  qint64 currentChatId() const { return current_chat_id_; }
  double currentChatIdNumber() const { return static_cast<double>(current_chat_id_); }
  QString currentTitle() const;
  bool currentGenerating() const { return generations_.count(current_chat_id_) > 0; }
  int generatingCount() const { return static_cast<int>(generations_.size()); }
  bool modelReady() const { return model_ready_; }
  void setModelReady(bool ready);
  QString searchText() const { return search_text_; }
  void setSearchText(const QString& text);
  QString deletedTitle() const { return deleted_ ? deleted_->title : QString(); }

  QString systemPrompt() const { return current().system_prompt; }
  void setSystemPrompt(const QString& prompt);
  // The open chat's sampling, clamped to the engine's ranges.
  SamplingEditor* samplingEditor() { return &sampling_editor_; }

  QString currentEngine() const { return current().engine; }
  void setCurrentEngine(const QString& engine);
  // How a request on an endpoint gets its key and stall timeout
  // (EndpointsController::whenAccessReady): `ready` runs at once, or later on this thread when
  // the keychain answers; until then the reply waits (shown as generating).
  using EndpointAccessSource =
      std::function<void(const QString& base_url, QObject* context,
                         std::function<void(const EndpointAccess& access)> ready)>;
  void setEndpointAccess(EndpointAccessSource source) { endpoint_access_ = std::move(source); }

  // What a new chat's sampling starts from (the settings' global defaults).
  void setDefaultSampling(const SamplingSettings& sampling) { default_sampling_ = sampling; }

  McpController* tools() const { return tools_; }
  // Offers the servers' tools in every chat; each call asks the user first (tool cards).
  void setTools(McpController* tools);
  // How a user's turn may use the tools: "" the model decides, "required" it must call one,
  // or a tool's name (that tool). Continuations after tool results are always "". The window
  // does not set it; the tests force calls from a model too small to make them on its own.
  void setToolChoice(const QString& choice) { tool_choice_ = choice; }

  // Reads the chats from the store; selects the newest.
  void loadFromStore();

  Q_INVOKABLE qint64 newChat();
  Q_INVOKABLE void selectChat(qint64 chat_id);
  Q_INVOKABLE void renameChat(qint64 chat_id, const QString& title);
  Q_INVOKABLE void deleteChat(qint64 chat_id);
  Q_INVOKABLE void undoDelete();
  // Sends in the open chat (making one when none is open).
  Q_INVOKABLE void send(const QString& text);
  Q_INVOKABLE void sendTo(qint64 chat_id, const QString& text);
  Q_INVOKABLE void stop();
  Q_INVOKABLE void stopChat(qint64 chat_id);
  // Generates a new version of the assistant message at `row`; the old version and the
  // turns after it stay in the store, one ‹ › away.
  Q_INVOKABLE void regenerate(int row);
  // Sends `text` as a new version of the user message at `row` (the old version and its
  // later turns are kept) and generates the answer.
  Q_INVOKABLE void editAndResend(int row, const QString& text);
  // Shows the previous (delta -1) or next (+1) version of the turn at `row`, with the later
  // turns of that version's branch. Not while the chat generates.
  Q_INVOKABLE void switchVersion(int row, int delta);
  // Continues the assistant message at `row` (the last one, cut at the length limit): the
  // model goes on writing the same message.
  Q_INVOKABLE void continueReply(int row);
  // The user's answer to the tool card at `row` (asking): "once" runs the call, "always" runs
  // it and every later call of that tool without asking, "deny" refuses it. Once every card of
  // the turn is answered and its calls are done, the model goes on with their results.
  Q_INVOKABLE void answerToolCall(int row, const QString& answer);
  // Writes the open chat (the branch shown) to `file` (a path or file: URL) as "markdown" or
  // "json"; false, with the reason in the banner, when it cannot be written.
  Q_INVOKABLE bool exportChat(const QUrl& file, const QString& format);

  // Writes streaming messages' text as it stands (shutdown): no chat loses what it shows.
  void saveAll();

 Q_SIGNALS:
  void currentChatChanged();
  void generatingChanged();
  void modelReadyChanged();
  void searchTextChanged();
  void undoChanged();
  void settingsChanged();
  // To the worker (queued).
  void generationRequested(const granule::app::GenerationRequest& request);
  void cancelRequested(qint64 chat_id);

 public Q_SLOTS:
  void onTokensArrived(const QList<granule::app::TokenChunk>& chunks);
  void onGenerationFinished(const granule::app::GenerationResult& result);
  // Settings the chat's engine does not apply: said once per engine and text in the banner.
  void onSettingsNotApplied(qint64 chat_id, const QString& engine, const QString& lines);

 private:
  struct Generation {
    int row = -1;                 // the assistant message being written
    QElapsedTimer since_request;  // time to first token
    QElapsedTimer since_first;    // tokens per second count from the first text
    bool has_text = false;
    QList<ToolCallText> calls;  // tool calls the reply made
    quint64 serial = 0;         // which request this is (a late endpoint access for an older
                                // one is dropped)
    bool sent = false;          // the worker has it (false while the endpoint's key is read)
  };
  const StoredConversation& current() const;
  void updateCurrent(const std::function<void(StoredConversation&)>& change);
  // Adds an empty assistant message to the chat and asks the worker to fill it.
  void startGeneration(qint64 chat_id);
  // Whether the chat's engine can answer (a chat on an endpoint needs no loaded model); when
  // not, says so in the error banner.
  bool modelReadyOrReport(qint64 chat_id);
  // Marks the chat generating into the message at `row` and sends the request to the worker.
  void requestGeneration(qint64 chat_id, int row, const GenerationRequest& request);
  // The request for the chat's shown messages (system prompt first).
  GenerationRequest requestFor(qint64 chat_id) const;
  // Reads the chat's shown branch from the store again (after a version change).
  void reloadMessages(qint64 chat_id);
  // Cancels a chat's running generation and closes its message now (before a new one).
  void abandonGeneration(qint64 chat_id);
  // After a reply that called tools: one card per call, run at once when always allowed.
  void addToolCards(qint64 chat_id, int reply_row, const QList<ToolCallText>& calls);
  void runToolCall(qint64 chat_id, int row);
  void onToolCallFinished(qint64 message_id, bool ok, const QString& text);
  // Generates again once every card after the last reply is settled (done, failed, denied).
  void continueAfterTools(qint64 chat_id);

  ChatStore& store_;
  ErrorReporter& errors_;
  ConversationListModel conversations_;
  MessageModel empty_messages_;
  std::map<qint64, MessageModel*> messages_;  // loaded chats, children of this
  std::map<qint64, Generation> generations_;
  quint64 generation_serial_ = 0;
  qint64 current_chat_id_ = 0;
  bool model_ready_ = false;
  QString search_text_;
  std::optional<StoredConversation> deleted_;
  SamplingSettings default_sampling_;
  SamplingEditor sampling_editor_;
  EndpointAccessSource endpoint_access_;
  QSet<QString> settings_notes_shown_;  // engine + text, once a session
  McpController* tools_ = nullptr;
  QString tool_choice_;
  std::map<qint64, qint64> running_calls_;  // tool message id -> chat id
};

}  // namespace granule::app
