// TelemetryModel: the live panels' data on the GUI thread — the last ~60 s of telemetry
// frames for the plots, the current figures as typed properties, and one row per
// generating chat (KV committed vs reserved) as a list model.
#pragma once
#include <QtQml/qqmlregistration.h>

#include <QAbstractListModel>
#include <deque>
#include <functional>

#include "worker_types.h"

namespace granule::app {

class TelemetryModel : public QAbstractListModel {
  Q_OBJECT
  QML_ELEMENT
  QML_UNCREATABLE("Telemetry comes from the engine worker")
  Q_PROPERTY(bool hasEngine READ hasEngine NOTIFY updated)
  Q_PROPERTY(int chatCount READ chatCount NOTIFY updated)
  Q_PROPERTY(bool gpu READ gpu NOTIFY updated)
  Q_PROPERTY(QString device READ device NOTIFY updated)
  Q_PROPERTY(double budgetBytes READ budgetBytes NOTIFY updated)
  Q_PROPERTY(double usedBytes READ usedBytes NOTIFY updated)
  Q_PROPERTY(double deviceTotalBytes READ deviceTotalBytes NOTIFY updated)
  Q_PROPERTY(QList<qreal> ledgerBytes READ ledgerBytes NOTIFY updated)
  Q_PROPERTY(QStringList ledgerCategories READ ledgerCategories CONSTANT)
  Q_PROPERTY(double kvReservedBytes READ kvReservedBytes NOTIFY updated)
  Q_PROPERTY(double hostTotalBytes READ hostTotalBytes NOTIFY updated)
  Q_PROPERTY(double hostAvailableBytes READ hostAvailableBytes NOTIFY updated)
  Q_PROPERTY(double processResidentBytes READ processResidentBytes NOTIFY updated)
  Q_PROPERTY(double streamedBytesPerSecond READ streamedBytesPerSecond NOTIFY updated)
  Q_PROPERTY(double streamedBytesTotal READ streamedBytesTotal NOTIFY updated)
  Q_PROPERTY(int layersResident READ layersResident NOTIFY updated)
  Q_PROPERTY(int layersStreamed READ layersStreamed NOTIFY updated)
  Q_PROPERTY(QList<int> graphBuckets READ graphBuckets NOTIFY updated)
  Q_PROPERTY(int segmentsPerStep READ segmentsPerStep NOTIFY updated)
  Q_PROPERTY(double graphReplays READ graphReplays NOTIFY updated)
  Q_PROPERTY(double graphRecaptures READ graphRecaptures NOTIFY updated)
  Q_PROPERTY(QString fallbackReason READ fallbackReason NOTIFY updated)
  Q_PROPERTY(double decodeTokensPerSecond READ decodeTokensPerSecond NOTIFY updated)
  Q_PROPERTY(double steps READ steps NOTIFY updated)
  Q_PROPERTY(double granulesMapped READ granulesMapped NOTIFY updated)
  Q_PROPERTY(double kvPoolBytes READ kvPoolBytes NOTIFY updated)
  Q_PROPERTY(double granulesMappedLastStep READ granulesMappedLastStep NOTIFY updated)
  Q_PROPERTY(double granulesCreatedLastStep READ granulesCreatedLastStep NOTIFY updated)
  Q_PROPERTY(double mappingUsLastStep READ mappingUsLastStep NOTIFY updated)
  Q_PROPERTY(int waitingChats READ waitingChats NOTIFY updated)
  Q_PROPERTY(double preemptions READ preemptions NOTIFY updated)
  Q_PROPERTY(double recomputedTokens READ recomputedTokens NOTIFY updated)
  Q_PROPERTY(qint64 highlightedChatId READ highlightedChatId WRITE setHighlightedChatId NOTIFY
                 highlightedChatIdChanged)

 public:
  static constexpr double kHistorySeconds = 60.0;

  enum Role {
    ChatIdRole = Qt::UserRole + 1,
    TitleRole,
    TokensRole,
    KvCommittedRole,
    KvReservedRole,
    TokensPerSecondRole,
    HighlightedRole,
    WaitingRole,
    PreemptionsRole,
  };
  Q_ENUM(Role)

  explicit TelemetryModel(QObject* parent = nullptr);

  int rowCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role) const override;
  QHash<int, QByteArray> roleNames() const override;

  // Names chats in the per-chat rows.
  void setTitleLookup(std::function<QString(qint64)> title_of) { title_of_ = std::move(title_of); }
  void addFrame(const TelemetryFrame& frame);
  const std::deque<TelemetryFrame>& history() const { return history_; }
  const TelemetryFrame& latest() const { return latest_; }

  int chatCount() const { return static_cast<int>(latest_.chats.size()); }
  bool hasEngine() const { return latest_.budget_bytes > 0 || !latest_.device.isEmpty(); }
  bool gpu() const { return latest_.gpu; }
  QString device() const { return latest_.device; }
  double budgetBytes() const { return static_cast<double>(latest_.budget_bytes); }
  double usedBytes() const;
  double deviceTotalBytes() const { return static_cast<double>(latest_.device_total_bytes); }
  QList<qreal> ledgerBytes() const;
  QStringList ledgerCategories() const;
  double kvReservedBytes() const { return static_cast<double>(latest_.kv_reserved_bytes); }
  double hostTotalBytes() const { return static_cast<double>(latest_.host_total_bytes); }
  double hostAvailableBytes() const { return static_cast<double>(latest_.host_available_bytes); }
  double processResidentBytes() const {
    return static_cast<double>(latest_.process_resident_bytes);
  }
  double streamedBytesPerSecond() const { return latest_.streamed_bytes_per_second; }
  double streamedBytesTotal() const { return static_cast<double>(latest_.streamed_bytes_total); }
  int layersResident() const { return latest_.layers_resident; }
  int layersStreamed() const { return latest_.layers_streamed; }
  QList<int> graphBuckets() const { return latest_.graph_buckets; }
  int segmentsPerStep() const { return latest_.segments_per_step; }
  double graphReplays() const { return static_cast<double>(latest_.graph_replays); }
  double graphRecaptures() const { return static_cast<double>(latest_.graph_recaptures); }
  QString fallbackReason() const { return latest_.last_fallback_reason; }
  double decodeTokensPerSecond() const { return latest_.decode_tokens_per_second; }
  double steps() const { return static_cast<double>(latest_.steps); }
  double granulesMapped() const { return static_cast<double>(latest_.granules_mapped); }
  double kvPoolBytes() const { return static_cast<double>(latest_.kv_pool_bytes); }
  double granulesMappedLastStep() const {
    return static_cast<double>(latest_.granules_mapped_last_step);
  }
  double granulesCreatedLastStep() const {
    return static_cast<double>(latest_.granules_created_last_step);
  }
  double mappingUsLastStep() const { return latest_.mapping_us_last_step; }
  int waitingChats() const { return latest_.waiting_chats; }
  double preemptions() const { return static_cast<double>(latest_.preemptions); }
  double recomputedTokens() const { return static_cast<double>(latest_.recomputed_tokens); }
  // Whether the KV budget holds this chat back in the latest frame (ids as numbers, as QML
  // sees them). Bindings that also read waitingChats re-evaluate with every frame.
  Q_INVOKABLE bool isWaiting(double chatId) const;
  qint64 highlightedChatId() const { return highlighted_chat_id_; }
  void setHighlightedChatId(qint64 id);

 Q_SIGNALS:
  void updated();
  void highlightedChatIdChanged();

 private:
  std::deque<TelemetryFrame> history_;
  TelemetryFrame latest_;
  std::function<QString(qint64)> title_of_;
  qint64 highlighted_chat_id_ = 0;
};

}  // namespace granule::app
