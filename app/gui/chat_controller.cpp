// Chat actions, streaming into the message models, and saving to the store.
#include "chat_controller.h"

#include <QDateTime>
#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QRegularExpression>
#include <QSaveFile>
#include <algorithm>

namespace granule::app {
namespace {

// Markdown's marks out of a line of text: headings, emphasis, code ticks, quotes, list
// bullets, and links reduced to their text.
QString plainText(QString text) {
  static const QRegularExpression link(QStringLiteral("!?\\[([^\\]]*)\\]\\([^)]*\\)"));
  static const QRegularExpression line_marks(
      QStringLiteral("^\\s*(#{1,6}\\s+|>\\s*|[-*+]\\s+|\\d+[.)]\\s+)"),
      QRegularExpression::MultilineOption);
  static const QRegularExpression emphasis(QStringLiteral("(\\*{1,3}|_{2,3}|~~|`+)"));
  // _word_ emphasis (not the underscores inside snake_case names).
  static const QRegularExpression underscores(QStringLiteral("(^|\\W)_([^_\\s][^_]*)_(?=\\W|$)"));
  text.replace(link, QStringLiteral("\\1"));
  text.replace(underscores, QStringLiteral("\\1\\2"));
  text.remove(line_marks);
  text.remove(emphasis);
  return text;
}

}  // namespace

// A title from the first words of the first message (Markdown marks removed), cut at a word
// boundary.
QString titleFrom(const QString& text) {
  QString line = plainText(text).simplified();
  if (line.isEmpty()) line = text.simplified();
  constexpr qsizetype kMax = 40;
  if (line.size() <= kMax) return line;
  const qsizetype cut = line.lastIndexOf(QLatin1Char(' '), kMax);
  return line.left(cut > 10 ? cut : kMax) + QStringLiteral("…");
}

namespace {

qint64 nowMs() { return QDateTime::currentMSecsSinceEpoch(); }
// The engine new chats start on: the one chosen last.
const QString kNewChatEngineKey = QStringLiteral("chat/engine");

QJsonObject toolOf(const StoredMessage& m) {
  return QJsonDocument::fromJson(m.tool.toUtf8()).object();
}
QString toolText(const QJsonObject& tool) {
  return QString::fromUtf8(QJsonDocument(tool).toJson(QJsonDocument::Compact));
}

// A tool card's state: "asking" (the user has not answered), "running", or settled: "done",
// "failed", "denied".
bool settled(const QString& state) {
  return state == QLatin1String("done") || state == QLatin1String("failed") ||
         state == QLatin1String("denied");
}

// What the model reads for a settled card.
QString toolResultForModel(const StoredMessage& m) {
  const QJsonObject tool = toolOf(m);
  const QString state = tool.value("state").toString();
  if (state == QLatin1String("denied")) return QStringLiteral("The user did not allow this call.");
  if (state == QLatin1String("failed"))
    return QStringLiteral("Error: ") + tool.value("error").toString();
  return m.content;
}

}  // namespace

ChatController::ChatController(ChatStore& store, ErrorReporter& errors, QObject* parent)
    : QObject(parent),
      store_(store),
      errors_(errors),
      sampling_editor_([this]() -> const SamplingSettings& { return current().sampling; },
                       [this](const SamplingSettings& sampling) {
                         updateCurrent([&](StoredConversation& c) { c.sampling = sampling; });
                       }) {
  connect(this, &ChatController::settingsChanged, &sampling_editor_, &SamplingEditor::changed);
  connect(this, &ChatController::currentChatChanged, &sampling_editor_, &SamplingEditor::changed);
}

void ChatController::setTools(McpController* tools) {
  tools_ = tools;
  if (tools_)
    connect(tools_, &McpController::callFinished, this, &ChatController::onToolCallFinished);
}

void ChatController::loadFromStore() {
  store_.purgeDeleted();  // deletions not undone last session
  conversations_.setConversations(store_.conversations());
  if (conversations_.count() > 0) selectChat(conversations_.idAt(0));
}

MessageModel* ChatController::messages() {
  MessageModel* model = current_chat_id_ ? messagesOf(current_chat_id_) : nullptr;
  return model ? model : &empty_messages_;
}

MessageModel* ChatController::messagesOf(qint64 chat_id) {
  if (const auto it = messages_.find(chat_id); it != messages_.end()) return it->second;
  if (!conversations_.find(chat_id)) return nullptr;
  auto* model = new MessageModel(this);
  model->setMessages(store_.messages(chat_id));
  messages_[chat_id] = model;
  return model;
}

QString ChatController::currentTitle() const {
  const StoredConversation* c = conversations_.find(current_chat_id_);
  return c ? c->title : QString();
}

const StoredConversation& ChatController::current() const {
  static const StoredConversation defaults;
  const StoredConversation* c = conversations_.find(current_chat_id_);
  return c ? *c : defaults;
}

void ChatController::updateCurrent(const std::function<void(StoredConversation&)>& change) {
  const StoredConversation* found = conversations_.find(current_chat_id_);
  if (!found) return;
  StoredConversation c = *found;
  change(c);
  c.updated_ms = found->updated_ms;  // settings do not reorder the sidebar
  conversations_.update(c);
  store_.updateConversation(c);
  Q_EMIT settingsChanged();
}

void ChatController::setModelReady(bool ready) {
  if (model_ready_ == ready) return;
  model_ready_ = ready;
  Q_EMIT modelReadyChanged();
}

void ChatController::setSearchText(const QString& text) {
  if (search_text_ == text) return;
  search_text_ = text;
  const QString query = text.trimmed();
  conversations_.setFilter(query.isEmpty() ? std::nullopt : std::optional(store_.search(query)));
  Q_EMIT searchTextChanged();
}

void ChatController::setSystemPrompt(const QString& prompt) {
  updateCurrent([&](StoredConversation& c) { c.system_prompt = prompt; });
}

void ChatController::setCurrentEngine(const QString& engine) {
  if (!conversations_.find(current_chat_id_) || engine == current().engine) return;
  updateCurrent([&](StoredConversation& c) { c.engine = engine; });
  store_.setSetting(kNewChatEngineKey, engine);
}
qint64 ChatController::newChat() {
  // An empty "New chat" is reused rather than joined by another (Ctrl+N pressed twice).
  for (int i = 0; i < conversations_.count(); ++i) {
    const qint64 id = conversations_.idAt(i);
    const StoredConversation* existing = conversations_.find(id);
    if (!existing || existing->title != kDefaultTitle || generations_.count(id)) continue;
    const MessageModel* loaded = messages_.count(id) ? messages_.at(id) : nullptr;
    if (loaded ? loaded->count() == 0 : store_.allMessages(id).isEmpty()) {
      if (!search_text_.isEmpty()) setSearchText({});
      selectChat(id);
      return id;
    }
  }
  StoredConversation c;
  c.title = kDefaultTitle;
  c.sampling = default_sampling_;
  c.engine = store_.setting(kNewChatEngineKey);
  c.created_ms = c.updated_ms = nowMs();
  const auto id = store_.createConversation(c);
  if (!id) {
    errors_.report(QStringLiteral("Could not save a new chat."), store_.path());
    return 0;
  }
  c.id = *id;
  if (!search_text_.isEmpty()) setSearchText({});  // a new chat should be visible
  conversations_.prepend(c);
  selectChat(c.id);
  return c.id;
}

void ChatController::selectChat(qint64 chat_id) {
  if (!conversations_.find(chat_id)) return;
  current_chat_id_ = chat_id;
  Q_EMIT currentChatChanged();
  Q_EMIT settingsChanged();
  Q_EMIT generatingChanged();
}

void ChatController::renameChat(qint64 chat_id, const QString& title) {
  const StoredConversation* found = conversations_.find(chat_id);
  const QString trimmed = title.simplified();
  if (!found || trimmed.isEmpty()) return;
  StoredConversation c = *found;
  c.title = trimmed;
  conversations_.update(c);
  store_.updateConversation(c);
  if (chat_id == current_chat_id_) Q_EMIT currentChatChanged();
}

void ChatController::deleteChat(qint64 chat_id) {
  abandonGeneration(chat_id);
  const auto taken = conversations_.take(chat_id);
  if (!taken) return;
  store_.setDeleted(chat_id, true);
  // Only the last deletion can be undone; an older one becomes final now.
  if (deleted_) store_.purgeDeleted();
  deleted_ = taken;
  if (const auto it = messages_.find(chat_id); it != messages_.end()) {
    it->second->deleteLater();
    messages_.erase(it);
  }
  if (current_chat_id_ == chat_id) {
    current_chat_id_ = 0;
    if (conversations_.count() > 0)
      selectChat(conversations_.idAt(0));
    else
      Q_EMIT currentChatChanged();
  }
  Q_EMIT undoChanged();
}

void ChatController::undoDelete() {
  if (!deleted_) return;
  store_.setDeleted(deleted_->id, false);
  conversations_.restore(*deleted_);
  const qint64 id = deleted_->id;
  deleted_.reset();
  selectChat(id);
  Q_EMIT undoChanged();
}

void ChatController::send(const QString& text) {
  qint64 chat = current_chat_id_;
  if (!chat) chat = newChat();
  if (chat) sendTo(chat, text);
}

void ChatController::sendTo(qint64 chat_id, const QString& text) {
  const QString content = text.trimmed();
  MessageModel* model = messagesOf(chat_id);
  if (content.isEmpty() || !model) return;
  if (!modelReadyOrReport(chat_id)) return;
  abandonGeneration(chat_id);
  StoredMessage m;
  m.conversation_id = chat_id;
  m.position = model->count();
  m.role = QStringLiteral("user");
  m.content = content;
  m.created_ms = nowMs();
  m.parent_id = model->count() > 0 ? model->message(model->count() - 1).id : 0;
  const auto id = store_.insertMessage(m);
  m.id = id.value_or(0);
  if (m.id) m.version = m.version_count = static_cast<qint32>(store_.versionsOf(m.id).size());
  model->append(m);
  if (const StoredConversation* c = conversations_.find(chat_id); c && c->title == kDefaultTitle)
    renameChat(chat_id, titleFrom(content));
  conversations_.touch(chat_id, nowMs());
  startGeneration(chat_id);
}

void ChatController::stop() { stopChat(current_chat_id_); }

void ChatController::stopChat(qint64 chat_id) {
  const auto it = generations_.find(chat_id);
  if (it == generations_.end()) return;
  if (it->second.sent) {
    Q_EMIT cancelRequested(chat_id);
    return;
  }
  // Still waiting for the endpoint's key: the worker never had it, so it ends here.
  GenerationResult stopped;
  stopped.chat_id = chat_id;
  stopped.end = GenerationEnd::Stopped;
  stopped.reason = QStringLiteral("cancelled");
  onGenerationFinished(stopped);
}

void ChatController::regenerate(int row) {
  MessageModel* model = messagesOf(current_chat_id_);
  if (!model || row < 0 || row >= model->count() ||
      model->message(row).role != QLatin1String("assistant"))
    return;
  if (!modelReadyOrReport(current_chat_id_)) return;
  abandonGeneration(current_chat_id_);
  // The old version and its later turns stay in the store; the view shows the new branch.
  model->removeFrom(row);
  startGeneration(current_chat_id_);
}

void ChatController::editAndResend(int row, const QString& text) {
  MessageModel* model = messagesOf(current_chat_id_);
  if (!model || row < 0 || row >= model->count() ||
      model->message(row).role != QLatin1String("user") || text.trimmed().isEmpty())
    return;
  if (!modelReadyOrReport(current_chat_id_)) return;
  abandonGeneration(current_chat_id_);
  model->removeFrom(row);
  sendTo(current_chat_id_, text);
}

void ChatController::switchVersion(int row, int delta) {
  MessageModel* model = messagesOf(current_chat_id_);
  if (!model || row < 0 || row >= model->count() || generations_.count(current_chat_id_)) return;
  const QList<qint64> versions = store_.versionsOf(model->message(row).id);
  const qsizetype at = versions.indexOf(model->message(row).id);
  const qsizetype next = at + delta;
  if (at < 0 || next < 0 || next >= versions.size()) return;
  store_.setActiveVersion(versions[next]);
  reloadMessages(current_chat_id_);
}

void ChatController::continueReply(int row) {
  const qint64 chat_id = current_chat_id_;
  MessageModel* model = messagesOf(chat_id);
  if (!model || row != model->count() - 1 || generations_.count(chat_id) ||
      model->message(row).role != QLatin1String("assistant") ||
      model->message(row).finish_reason != QLatin1String("length"))
    return;
  if (!modelReadyOrReport(current_chat_id_)) return;
  GenerationRequest request = requestFor(chat_id);
  request.continue_last = true;
  model->resume(row);
  requestGeneration(chat_id, row, request);
}

void ChatController::reloadMessages(qint64 chat_id) {
  if (const auto it = messages_.find(chat_id); it != messages_.end())
    it->second->setMessages(store_.messages(chat_id));
}

bool ChatController::exportChat(const QUrl& file, const QString& format) {
  const StoredConversation* chat = conversations_.find(current_chat_id_);
  if (!chat) return false;
  const QString path = file.isLocalFile() ? file.toLocalFile() : file.toString();
  const QList<StoredMessage> shown = store_.messages(current_chat_id_);
  const QByteArray bytes = format == QLatin1String("json") ? chatToJson(*chat, shown)
                                                           : chatToMarkdown(*chat, shown).toUtf8();
  QSaveFile out(path);
  if (!out.open(QIODevice::WriteOnly) || out.write(bytes) != bytes.size() || !out.commit()) {
    errors_.report(
        QStringLiteral("Could not export the chat to %1: %2").arg(path, out.errorString()),
        QStringLiteral("Choose a folder you can write to."));
    return false;
  }
  return true;
}

GenerationRequest ChatController::requestFor(qint64 chat_id) const {
  GenerationRequest request;
  request.chat_id = chat_id;
  const StoredConversation* c = conversations_.find(chat_id);
  const auto it = messages_.find(chat_id);
  if (!c || it == messages_.end()) return request;
  request.sampling = c->sampling;
  request.engine = c->engine;  // its key and stall timeout: requestGeneration
  if (!c->system_prompt.trimmed().isEmpty())
    request.messages.append({QStringLiteral("system"), c->system_prompt});
  const QList<StoredMessage> shown = it->second->messages();
  for (const StoredMessage& m : shown) {
    PromptMessage p{m.role, m.content};
    if (m.role == QLatin1String("tool")) {
      const QJsonObject tool = toolOf(m);
      p.content = toolResultForModel(m);
      p.tool_call_id = tool.value("id").toString();
      p.name = tool.value("name").toString();
    } else if (m.role == QLatin1String("assistant") && !m.tool.isEmpty()) {
      // OpenAI's tool_calls, which the template renders in the model's own format.
      QJsonArray calls;
      for (const QJsonValue& c : toolOf(m).value("calls").toArray()) {
        const QJsonObject call = c.toObject();
        calls.append(QJsonObject{
            {"id", call.value("id")},
            {"type", "function"},
            {"function",
             QJsonObject{{"name", call.value("name")}, {"arguments", call.value("arguments")}}}});
      }
      p.tool_calls_json = QString::fromUtf8(QJsonDocument(calls).toJson(QJsonDocument::Compact));
    }
    request.messages.append(p);
  }
  if (tools_) {
    request.tools_json = tools_->toolsJson();
    // A forced call only answers the user; after tool results the model decides.
    if (!request.tools_json.isEmpty() && !shown.isEmpty() &&
        shown.last().role == QLatin1String("user"))
      request.tool_choice = tool_choice_;
  }
  return request;
}

void ChatController::startGeneration(qint64 chat_id) {
  MessageModel* model = messagesOf(chat_id);
  const StoredConversation* c = conversations_.find(chat_id);
  if (!model || !c) return;
  const GenerationRequest request = requestFor(chat_id);

  StoredMessage reply;
  reply.conversation_id = chat_id;
  reply.position = model->count();
  reply.role = QStringLiteral("assistant");
  reply.created_ms = nowMs();
  reply.parent_id = model->count() > 0 ? model->message(model->count() - 1).id : 0;
  const auto id = store_.insertMessage(reply);
  reply.id = id.value_or(0);
  if (reply.id) {
    const QList<qint64> versions = store_.versionsOf(reply.id);
    reply.version = static_cast<qint32>(versions.size());
    reply.version_count = reply.version;
  }
  const int row = model->append(reply, /*generating=*/true);
  requestGeneration(chat_id, row, request);
}

bool ChatController::modelReadyOrReport(qint64 chat_id) {
  if (const StoredConversation* c = conversations_.find(chat_id); c && !c->engine.isEmpty())
    return true;  // the endpoint answers, or the reply fails with its one line
  if (!model_ready_)
    errors_.report(QStringLiteral("No model is loaded."),
                   QStringLiteral("Open a GGUF model first."));
  return model_ready_;
}

void ChatController::requestGeneration(qint64 chat_id, int row, const GenerationRequest& request) {
  Generation g;
  g.row = row;
  g.since_request.start();
  g.serial = ++generation_serial_;
  generations_[chat_id] = g;
  conversations_.setGenerating(chat_id, true);
  Q_EMIT generatingChanged();
  if (request.engine.isEmpty() || !endpoint_access_) {
    generations_[chat_id].sent = true;
    Q_EMIT generationRequested(request);
    return;
  }
  // A chat on an endpoint goes out with the endpoint's key: at start-up the keychain may still
  // be reading it, and a request sent meanwhile would go without it (401).
  const qsizetype hash = request.engine.indexOf(QLatin1Char('#'));
  endpoint_access_(request.engine.left(hash), this,
                   [this, chat_id, serial = g.serial, request](const EndpointAccess& access) {
                     const auto it = generations_.find(chat_id);
                     if (it == generations_.end() || it->second.serial != serial) return;
                     if (!access.error.isEmpty()) {
                       GenerationResult failed;
                       failed.chat_id = chat_id;
                       failed.end = GenerationEnd::Failed;
                       failed.reason = QStringLiteral("error");
                       failed.error = access.error;
                       onGenerationFinished(failed);
                       return;
                     }
                     GenerationRequest sent = request;
                     sent.api_key = access.api_key;
                     sent.stall_timeout_seconds = access.stall_timeout_seconds;
                     it->second.sent = true;
                     Q_EMIT generationRequested(sent);
                   });
}

void ChatController::abandonGeneration(qint64 chat_id) {
  const auto it = generations_.find(chat_id);
  if (it == generations_.end()) return;
  // The worker drops the cancelled sequence's finish once a newer request takes the chat,
  // so the message is closed here rather than on its signal.
  Q_EMIT cancelRequested(chat_id);
  if (MessageModel* model = messagesOf(chat_id)) {
    model->finish(it->second.row, QStringLiteral("cancelled"));
    store_.updateMessage(model->message(it->second.row));
  }
  generations_.erase(it);
  conversations_.setGenerating(chat_id, false);
  Q_EMIT generatingChanged();
}

void ChatController::onTokensArrived(const QList<TokenChunk>& chunks) {
  for (const TokenChunk& chunk : chunks) {
    const auto it = generations_.find(chunk.chat_id);
    MessageModel* model = messagesOf(chunk.chat_id);
    if (it == generations_.end() || !model) continue;  // stopped or deleted meanwhile
    Generation& g = it->second;
    if (!g.has_text) {
      g.has_text = true;
      g.since_first.start();
      // A continued reply keeps the time to first token of its first part.
      if (model->message(g.row).time_to_first_token_ms <= 0)
        model->setTimeToFirstToken(g.row,
                                   static_cast<double>(g.since_request.nsecsElapsed()) / 1e6);
    }
    model->setPromptTokens(g.row, chunk.prompt_tokens);
    // Turns the engine left out to fit the context: mark where the model's view begins.
    model->setViewStartRow(chunk.dropped_messages > 0 ? chunk.dropped_messages : -1);
    model->appendText(g.row, chunk.text, chunk.tokens,
                      static_cast<double>(g.since_first.elapsed()) / 1000.0, chunk.reasoning);
    g.calls.append(chunk.tool_calls);
  }
}

void ChatController::onGenerationFinished(const GenerationResult& result) {
  const auto it = generations_.find(result.chat_id);
  if (it == generations_.end()) return;
  const int row = it->second.row;
  const QList<ToolCallText> calls = it->second.calls;
  generations_.erase(it);
  conversations_.setGenerating(result.chat_id, false);
  if (MessageModel* model = messagesOf(result.chat_id)) {
    // A reply that called tools ends for them (OpenAI's finish reason).
    const bool called = !calls.isEmpty() && result.end == GenerationEnd::Finished;
    model->finish(row, called ? QStringLiteral("tool_calls") : result.reason);
    model->setPromptTokens(row, result.prompt_tokens);
    if (result.end == GenerationEnd::Failed && model->message(row).content.isEmpty() &&
        model->message(row).reasoning.isEmpty()) {
      // Nothing was written: the empty reply goes (the banner says why) and the turn shows
      // its previous version, if it had one.
      if (store_.deleteLeafMessage(model->message(row).id))
        model->setMessages(store_.messages(result.chat_id));
      else
        model->removeFrom(row);
    } else {
      if (called) {
        StoredMessage reply = model->message(row);
        QJsonArray list;
        for (const ToolCallText& c : calls)
          list.append(QJsonObject{{"id", c.id}, {"name", c.name}, {"arguments", c.arguments}});
        reply.tool = toolText(QJsonObject{{"calls", list}});
        model->replace(row, reply);
      }
      store_.updateMessage(model->message(row));
      if (called) addToolCards(result.chat_id, row, calls);
    }
  }
  if (result.end == GenerationEnd::Failed)
    errors_.report(result.error, QStringLiteral("The chat is kept; fix the cause and regenerate."));
  Q_EMIT generatingChanged();
}

void ChatController::onSettingsNotApplied(qint64 chat_id, const QString& engine,
                                          const QString& lines) {
  (void)chat_id;
  const QString key = engine + QLatin1Char('\n') + lines;
  if (settings_notes_shown_.contains(key)) return;
  settings_notes_shown_.insert(key);
  errors_.report(lines, QStringLiteral("The chat runs on; the server's defaults apply to these."));
}

void ChatController::saveAll() {
  for (const auto& [chat, generation] : generations_) {
    MessageModel* model = messagesOf(chat);
    if (!model) continue;
    model->finish(generation.row, QStringLiteral("interrupted"));
    store_.updateMessage(model->message(generation.row));
  }
  generations_.clear();
}

void ChatController::addToolCards(qint64 chat_id, int reply_row, const QList<ToolCallText>& calls) {
  MessageModel* model = messagesOf(chat_id);
  if (!model) return;
  qint64 parent = model->message(reply_row).id;
  QList<int> run_now;
  for (const ToolCallText& call : calls) {
    StoredMessage card;
    card.conversation_id = chat_id;
    card.position = model->count();
    card.role = QStringLiteral("tool");
    card.created_ms = nowMs();
    card.parent_id = parent;
    const QString server = tools_ ? tools_->serverOf(call.name) : QString();
    const bool always = tools_ && tools_->alwaysAllowed(call.name);
    QJsonObject tool{{"id", call.id},
                     {"name", call.name},
                     {"server", server},
                     {"arguments", call.arguments},
                     {"state", "asking"}};
    if (server.isEmpty()) {  // no server offers it (any more): nothing to ask
      tool.insert("state", "failed");
      tool.insert("error",
                  QStringLiteral("no connected MCP server offers the tool '%1'").arg(call.name));
    }
    card.tool = toolText(tool);
    card.id = store_.insertMessage(card).value_or(0);
    parent = card.id;
    const int row = model->append(card);
    if (always && !server.isEmpty()) run_now.append(row);
  }
  for (const int row : run_now) runToolCall(chat_id, row);
  continueAfterTools(chat_id);
}

void ChatController::answerToolCall(int row, const QString& answer) {
  const qint64 chat_id = current_chat_id_;
  MessageModel* model = messagesOf(chat_id);
  if (!model || row < 0 || row >= model->count() ||
      model->message(row).role != QLatin1String("tool"))
    return;
  StoredMessage card = model->message(row);
  QJsonObject tool = toolOf(card);
  if (tool.value("state").toString() != QLatin1String("asking")) return;
  if (answer == QLatin1String("deny")) {
    tool.insert("state", "denied");
    card.tool = toolText(tool);
    model->replace(row, card);
    store_.updateMessage(card);
    continueAfterTools(chat_id);
    return;
  }
  if (answer == QLatin1String("always") && tools_)
    tools_->allowAlways(tool.value("name").toString());
  if (answer == QLatin1String("once") || answer == QLatin1String("always"))
    runToolCall(chat_id, row);
}

void ChatController::runToolCall(qint64 chat_id, int row) {
  MessageModel* model = messagesOf(chat_id);
  if (!model || !tools_) return;
  StoredMessage card = model->message(row);
  QJsonObject tool = toolOf(card);
  tool.insert("state", "running");
  card.tool = toolText(tool);
  model->replace(row, card);
  store_.updateMessage(card);
  running_calls_[card.id] = chat_id;
  tools_->startCall(card.id, tool.value("name").toString(), tool.value("arguments").toString());
}

void ChatController::onToolCallFinished(qint64 message_id, bool ok, const QString& text) {
  const auto running = running_calls_.find(message_id);
  if (running == running_calls_.end()) return;
  const qint64 chat_id = running->second;
  running_calls_.erase(running);
  MessageModel* model = messagesOf(chat_id);
  if (!model) return;  // the chat was deleted meanwhile
  for (int row = 0; row < model->count(); ++row) {
    if (model->message(row).id != message_id) continue;
    StoredMessage card = model->message(row);
    QJsonObject tool = toolOf(card);
    tool.insert("state", ok ? "done" : "failed");
    if (ok) {
      card.content = text;
    } else {
      tool.insert("error", text.isEmpty() ? QStringLiteral("the tool failed") : text);
    }
    card.tool = toolText(tool);
    model->replace(row, card);
    store_.updateMessage(card);
    continueAfterTools(chat_id);
    return;
  }
}

void ChatController::continueAfterTools(qint64 chat_id) {
  MessageModel* model = messagesOf(chat_id);
  if (!model || generations_.count(chat_id) || model->count() == 0) return;
  // The cards after the last reply; generation goes on when all are settled.
  int cards = 0;
  for (int row = model->count() - 1; row >= 0; --row) {
    const StoredMessage& m = model->message(row);
    if (m.role != QLatin1String("tool")) break;
    if (!settled(toolOf(m).value("state").toString())) return;
    ++cards;
  }
  if (cards == 0 || !model_ready_) return;
  startGeneration(chat_id);
}

}  // namespace granule::app
