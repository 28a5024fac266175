// The model's facts and the fit preview's wording from the engine's estimate, and host
// memory figures from /proc.
#include "model_inspector.h"

#include <unistd.h>

#include <QFile>
#include <QFileInfo>
#include <QLocale>

namespace granule::app {
namespace {

quint64 meminfoField(const QByteArray& field) {
  QFile meminfo(QStringLiteral("/proc/meminfo"));
  if (!meminfo.open(QIODevice::ReadOnly)) return 0;
  for (const QByteArray& line : meminfo.readAll().split('\n')) {
    if (!line.startsWith(field + ':')) continue;
    const QList<QByteArray> parts = line.simplified().split(' ');
    if (parts.size() >= 2) return parts[1].toULongLong() * 1024;  // values are in kB
  }
  return 0;
}

}  // namespace

ModelInfo modelInfo(const std::filesystem::path& path, const FitEstimate& estimate) {
  const ModelConfig& c = estimate.config;
  ModelInfo info;
  info.path = QString::fromStdString(path.string());
  info.name =
      c.name.empty() ? QFileInfo(info.path).completeBaseName() : QString::fromStdString(c.name);
  info.architecture = QString::fromStdString(c.architecture);
  info.block_type = QString::fromStdString(estimate.block_type);
  info.file_bytes = static_cast<qint64>(estimate.file_bytes);
  info.parameters = static_cast<qint64>(estimate.parameters);
  info.layers = c.n_layer;
  info.hidden = c.n_embd;
  info.heads = c.n_head;
  info.kv_heads = c.n_head_kv;
  info.vocab = c.n_vocab;
  info.trained_context = c.context_length;
  info.weights_bytes = estimate.weights_bytes;
  info.minimum_budget_bytes = estimate.minimum_budget_bytes;
  return info;
}

QString fitSummary(const FitEstimate& fit) {
  const QLocale locale;  // the user's digit grouping
  const QString budget_source =
      fit.gpu ? QStringLiteral("VRAM budget") : QStringLiteral("host memory");
  const quint64 kv_full =
      fit.kv_bytes_per_chat(fit.context_per_chat) * static_cast<quint64>(fit.chats);
  if (fit.fits) {
    return QStringLiteral("Fits: weights %1 + KV up to %2 (%3 chats × %4 tokens) in %5 of %6.")
        .arg(formatBytes(fit.weights_bytes), formatBytes(kv_full))
        .arg(fit.chats)
        .arg(locale.toString(fit.context_per_chat), formatBytes(fit.budget_bytes), budget_source);
  }
  if (fit.max_context_per_chat > 0) {
    return QStringLiteral(
               "Tight: at most %1 tokens per chat fit for %2 chats in %3 of %4; "
               "KV is committed as chats grow, so short chats still run.")
        .arg(locale.toString(fit.max_context_per_chat))
        .arg(fit.chats)
        .arg(formatBytes(fit.budget_bytes), budget_source);
  }
  return QStringLiteral(
             "Does not fit: the weights and workspace need %1 but the budget is %2; "
             "layers that do not fit are streamed on the GPU backend.")
      .arg(formatBytes(fit.weights_bytes + fit.workspace_bytes), formatBytes(fit.budget_bytes));
}

quint64 hostAvailableBytes() { return meminfoField("MemAvailable"); }
quint64 hostTotalBytes() { return meminfoField("MemTotal"); }

quint64 processResidentBytes() {
  QFile statm(QStringLiteral("/proc/self/statm"));
  if (!statm.open(QIODevice::ReadOnly)) return 0;
  const QList<QByteArray> fields = statm.readAll().simplified().split(' ');
  if (fields.size() < 2) return 0;
  return fields[1].toULongLong() * static_cast<quint64>(sysconf(_SC_PAGESIZE));  // in pages
}

QString formatBytes(quint64 bytes) {
  constexpr double kKiB = 1024.0, kMiB = kKiB * 1024, kGiB = kMiB * 1024;
  const double b = static_cast<double>(bytes);
  if (b >= kGiB)
    return QString::number(b / kGiB, 'f', b >= 100 * kGiB ? 0 : 1) + QStringLiteral(" GiB");
  if (b >= kMiB)
    return QString::number(b / kMiB, 'f', b >= 100 * kMiB ? 0 : 1) + QStringLiteral(" MiB");
  if (b >= kKiB) return QString::number(b / kKiB, 'f', 0) + QStringLiteral(" KiB");
  return QString::number(bytes) + QStringLiteral(" B");
}

}  // namespace granule::app
