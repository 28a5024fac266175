// TelemetryModel: the live panels' data on the GUI thread — the latest telemetry frame as
// one value (QML reads telemetry.frame.kv.poolBytes), the last ~60 s of frames for the plots,
// and one row per generating chat, then per request of the window's API server (the engine's
// figures for its sequence), as a list model.
#pragma once
#include <QtQml/qqmlregistration.h>

#include <deque>
#include <functional>

#include "list_model.h"
#include "worker_types.h"

namespace granule::app {

class TelemetryModel : public granule::app::ListModel {
  Q_OBJECT
  QML_ELEMENT
  QML_UNCREATABLE("Telemetry comes from the engine worker")
  Q_PROPERTY(granule::app::TelemetryFrame frame READ latest NOTIFY updated)
  // The keys of frame.device.ledger the panels stack, bottom first (Theme's ledger colours
  // and names follow this order).
  Q_PROPERTY(QStringList ledgerCategories READ ledgerCategories CONSTANT)
  // The recording's file name while the panels replay one (granule --replay), else "".
  Q_PROPERTY(QString replaySource READ replaySource NOTIFY replaySourceChanged)
  // Decode tokens per second over the last kRateWindowSeconds (0 when nothing generates).
  Q_PROPERTY(double recentTokensPerSecond READ recentTokensPerSecond NOTIFY updated)
  Q_PROPERTY(qint64 highlightedChatId READ highlightedChatId WRITE setHighlightedChatId NOTIFY
                 highlightedChatIdChanged)

 public:
  static constexpr double kHistorySeconds = 60.0;
  static constexpr double kRateWindowSeconds = 3.0;

  enum Role {
    ChatIdRole = Qt::UserRole + 1,
    TitleRole,
    HighlightedRole,
    SequenceRole,  // the engine's SequenceTelemetry as a map (kvCommittedBytes, waiting, ...)
    ApiRole,       // the row is an API request (chatId 0; its title is the request's id)
  };
  Q_ENUM(Role)

  explicit TelemetryModel(QObject* parent = nullptr);

  // Names chats in the per-chat rows.
  void setTitleLookup(std::function<QString(qint64)> title_of) { title_of_ = std::move(title_of); }
  // Live frames (counts_tokens) get their throughput's decode_tokens_per_second replaced by
  // the rate over the last kRateWindowSeconds, so the figure and the plot show now, not the
  // engine's lifetime average; replayed frames keep what was recorded.
  void addFrame(TelemetryFrame frame);
  const std::deque<TelemetryFrame>& history() const { return history_; }
  const TelemetryFrame& latest() const { return latest_; }

  QStringList ledgerCategories() const;
  // Whether the KV budget holds this chat back in the latest frame (ids as numbers, as QML
  // sees them). Bindings that also read the frame re-evaluate with every frame.
  Q_INVOKABLE bool isWaiting(double chatId) const;
  // Why a chat waits in the latest frame: "slot" (every chat slot is taken), "memory" (a
  // slot is free but the KV budget holds it back), or "" when it does not wait.
  Q_INVOKABLE QString waitingReason(double chatId) const;
  double recentTokensPerSecond() const {
    return latest_.engine.throughput.decode_tokens_per_second;
  }
  QString replaySource() const { return replay_source_; }
  void setReplaySource(const QString& name);
  qint64 highlightedChatId() const { return highlighted_chat_id_; }
  void setHighlightedChatId(qint64 id);

 Q_SIGNALS:
  void updated();
  void highlightedChatIdChanged();
  void replaySourceChanged();

 private:
  int itemCount() const override {
    return static_cast<int>(latest_.chats.size() + latest_.api_requests.size());
  }
  QVariant value(int row, int role) const override;
  int chatRows() const { return static_cast<int>(latest_.chats.size()); }

  std::deque<TelemetryFrame> history_;
  TelemetryFrame latest_;
  std::function<QString(qint64)> title_of_;
  qint64 highlighted_chat_id_ = 0;
  QString replay_source_;
};

}  // namespace granule::app
