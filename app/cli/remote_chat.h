// `granule-cli chat --endpoint URL --model M`: the same conversation loop as a local chat, on
// an OpenAI-compatible server (remote_chat.cpp, built with the remote client).
#pragma once
#include <cstdint>
#include <string>

#include "cli.h"
#include "generation.h"

namespace granule::cli {

struct RemoteChatOptions {
  std::string endpoint;                // base URL; "" = the local engine
  std::string api_key_env;             // the environment variable holding the API key; "" = none
  std::string model;                   // the endpoint's model id; "" = its only model
  int32_t stall_timeout_seconds = 60;  // --stall-timeout: a stream silent this long has stalled
  bool preset_given = false;  // --preset was on the line (presets are local-engine settings)
};

int run_remote_chat(const RemoteChatOptions& remote, const GenerationOptions& options);

}  // namespace granule::cli
