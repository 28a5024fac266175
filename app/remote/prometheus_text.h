// A reader of the Prometheus text exposition format (0.0.4) as engines serve it on /metrics:
// each sample's name, labels and value; HELP, TYPE and comment lines are skipped.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace granule::remote {

struct PrometheusSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

struct PrometheusText {
  std::vector<PrometheusSample> samples;
  int skipped_lines = 0;  // lines that were not a sample it could read
  // The sum of every sample named `name` (all label sets), or nothing when none is present.
  std::optional<double> sum(std::string_view name) const;
  // Their mean (for ratios reported per engine or per rank).
  std::optional<double> mean(std::string_view name) const;
  bool has_prefix(std::string_view prefix) const;
};

PrometheusText parse_prometheus_text(std::string_view text);

}  // namespace granule::remote
