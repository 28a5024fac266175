// Model facts straight from GGUF metadata (so an architecture the engine rejects can
// still be described), and the arithmetic of the fit preview.
#include "model_inspector.h"

#include <unistd.h>

#include <QFile>
#include <QFileInfo>
#include <QLocale>
#include <algorithm>
#include <map>

#include "granule/gguf.h"
#include "granule/tensor_type.h"

namespace granule::app {
namespace {

int64_t metadataInt(const ModelFile& file, const std::string& key, int64_t fallback = 0) {
  const auto value = file.get_int(key);
  return value ? *value : fallback;
}

// The block type holding the most bytes among 2-D weights: what people call the
// model's quantisation ("Q4_1"), even though norms stay F32.
QString dominantBlockType(const ModelFile& file) {
  std::map<uint32_t, uint64_t> bytes_by_type;
  for (const TensorInfo& tensor : file.tensors())
    if (tensor.dims.size() >= 2) bytes_by_type[tensor.ggml_type] += tensor.size_bytes;
  if (bytes_by_type.empty()) return QStringLiteral("unknown");
  const auto top =
      std::max_element(bytes_by_type.begin(), bytes_by_type.end(),
                       [](const auto& a, const auto& b) { return a.second < b.second; });
  return QString::fromStdString(tensor_type_name(top->first));
}

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

ModelInspection inspectModel(const std::filesystem::path& path) {
  const auto file = ModelFile::open(path);
  ModelInspection result;
  ModelInfo& info = result.info;
  info.path = QString::fromStdString(path.string());
  info.file_bytes = static_cast<qint64>(file->file_size());
  const std::string arch = file->get_string("general.architecture").value_or("unknown");
  info.architecture = QString::fromStdString(arch);
  info.name =
      QString::fromStdString(file->get_string("general.name")
                                 .value_or(QFileInfo(info.path).completeBaseName().toStdString()));
  info.layers = metadataInt(*file, arch + ".block_count");
  info.hidden = metadataInt(*file, arch + ".embedding_length");
  info.heads = metadataInt(*file, arch + ".attention.head_count");
  info.kv_heads = metadataInt(*file, arch + ".attention.head_count_kv", info.heads);
  info.trained_context = metadataInt(*file, arch + ".context_length");
  if (const GgufValue* tokens = file->find("tokenizer.ggml.tokens"))
    info.vocab = static_cast<qint64>(tokens->array_size());
  info.block_type = dominantBlockType(*file);
  for (const TensorInfo& tensor : file->tensors()) {
    info.parameters += tensor.elements();
    result.weights_bytes += tensor.size_bytes;
  }
  const int64_t head_dim =
      info.heads > 0 ? metadataInt(*file, arch + ".attention.key_length", info.hidden / info.heads)
                     : 0;
  result.kv_bytes_per_token =
      static_cast<quint64>(info.layers * 2 * info.kv_heads * head_dim * 2);  // fp16 K and V
  return result;
}

FitReport estimateFit(const ModelInspection& inspection, const EngineOptions& options,
                      quint64 budget_bytes, bool gpu) {
  FitReport fit;
  fit.gpu = gpu;
  fit.budget_source = gpu ? QStringLiteral("VRAM budget") : QStringLiteral("host memory available");
  fit.budget_bytes = budget_bytes;
  fit.weights_bytes = inspection.weights_bytes;
  fit.kv_bytes_per_token = inspection.kv_bytes_per_token;
  fit.chats = options.max_sequences;
  const qint64 trained = inspection.info.trained_context;
  fit.context_per_chat =
      trained > 0 ? std::min<qint64>(options.context_length, trained) : options.context_length;
  // Workspace: activations are small next to the logits of every slot (fp32 per vocab
  // entry) plus a fixed allowance for scratch buffers.
  fit.workspace_bytes = static_cast<quint64>(std::max<qint64>(inspection.info.vocab, 0)) * 4 *
                            static_cast<quint64>(std::max(fit.chats, 1)) +
                        (64ull << 20);
  const quint64 fixed = fit.weights_bytes + fit.workspace_bytes;
  if (budget_bytes > fixed && fit.kv_bytes_per_token > 0 && fit.chats > 0) {
    const quint64 per_chat = (budget_bytes - fixed) / static_cast<quint64>(fit.chats);
    fit.max_context_that_fits = static_cast<qint64>(per_chat / fit.kv_bytes_per_token);
    if (trained > 0) fit.max_context_that_fits = std::min(fit.max_context_that_fits, trained);
  }
  fit.fits = fit.max_context_that_fits >= fit.context_per_chat && fit.context_per_chat > 0;
  const QLocale locale;  // the user's digit grouping
  const quint64 kv_full = fit.kv_bytes_per_token * static_cast<quint64>(fit.context_per_chat) *
                          static_cast<quint64>(fit.chats);
  if (fit.fits) {
    fit.summary = QStringLiteral("Fits: weights %1 + KV up to %2 (%3 chats × %4 tokens) in %5 %6.")
                      .arg(formatBytes(fit.weights_bytes), formatBytes(kv_full))
                      .arg(fit.chats)
                      .arg(locale.toString(fit.context_per_chat), formatBytes(budget_bytes),
                           fit.budget_source);
  } else if (fit.max_context_that_fits > 0) {
    fit.summary = QStringLiteral(
                      "Tight: at most %1 tokens per chat fit for %2 chats in %3 %4; "
                      "KV is committed as chats grow, so short chats still run.")
                      .arg(locale.toString(fit.max_context_that_fits))
                      .arg(fit.chats)
                      .arg(formatBytes(budget_bytes), fit.budget_source);
  } else {
    fit.summary = QStringLiteral(
                      "Does not fit: the weights need %1 but only %2 is available; "
                      "layers that do not fit are streamed on the GPU backend.")
                      .arg(formatBytes(fixed), formatBytes(budget_bytes));
  }
  return fit;
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
