// ChatTemplate: recognises a model's prompt format from its Jinja source by the format's
// marker strings, and renders conversations exactly as each family's official template does
// (the fallback, and the user's override); chat_template_jinja.cpp runs the source itself.
#include "granule/chat_template.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <ctime>
#include <optional>

#include "granule/error.h"
#include "granule/log.h"

namespace granule {
namespace {

struct FamilyName {
  TemplateFamily family;
  std::string_view name;
};
constexpr std::array<FamilyName, 6> kFamilyNames{{
    {TemplateFamily::ChatML, "chatml"},
    {TemplateFamily::Llama3, "llama3"},
    {TemplateFamily::Llama2, "llama2"},
    {TemplateFamily::Mistral, "mistral"},
    {TemplateFamily::Gemma, "gemma"},
    {TemplateFamily::Phi3, "phi3"},
}};

bool contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

// Jinja's `trim` and Python's str.strip() on the ASCII whitespace a chat message carries.
std::string_view trim(std::string_view s) {
  constexpr std::string_view kSpace = " \t\n\r\f\v";
  const size_t first = s.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return {};
  const size_t last = s.find_last_not_of(kSpace);
  return s.substr(first, last - first + 1);
}

// The first characters of a template, on one line, for an error message.
std::string excerpt(std::string_view source) {
  constexpr size_t kMaxChars = 60;
  std::string out;
  for (char c : source.substr(0, kMaxChars)) out += (c == '\n' || c == '\r' || c == '\t') ? ' ' : c;
  if (source.size() > kMaxChars) out += "...";
  return out;
}

// Undoes the escapes a Jinja string literal may hold (\n, \t, \\, \', \").
std::string unescape_jinja_literal(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char next = s[++i];
    switch (next) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      default:
        out += next;
        break;  // \\, \', \"
    }
  }
  return out;
}

// A ChatML template that writes a fixed system turn when the conversation has none holds it
// as one string literal: '<|im_start|>system\nYou are ...<|im_end|>'. Templates that write
// the caller's system message instead concatenate it ('...system\n' + message['content']),
// so a quote or a Jinja delimiter inside the span means "not a literal default".
std::string find_chatml_default_system(std::string_view source) {
  constexpr std::string_view kHeader = "<|im_start|>system";
  constexpr std::string_view kEnd = "<|im_end|>";
  for (size_t at = source.find(kHeader); at != std::string_view::npos;
       at = source.find(kHeader, at + 1)) {
    if (at == 0 || (source[at - 1] != '\'' && source[at - 1] != '"')) continue;
    std::string_view rest = source.substr(at + kHeader.size());
    if (rest.starts_with("\\n")) {
      rest.remove_prefix(2);
    } else if (rest.starts_with('\n')) {
      rest.remove_prefix(1);
    } else {
      continue;
    }
    const size_t end = rest.find(kEnd);
    if (end == std::string_view::npos || end == 0) continue;
    const std::string_view body = rest.substr(0, end);
    if (body.find_first_of("'\"{}") != std::string_view::npos) continue;
    return unescape_jinja_literal(body);
  }
  return {};
}

// The text of a Jinja string literal that starts right after `marker` in the source, up
// to its first escaped or real newline or its closing quote: "December 2023" from
// "Cutting Knowledge Date: December 2023\n". "" when the marker is absent.
std::string literal_after(std::string_view source, std::string_view marker) {
  const size_t at = source.find(marker);
  if (at == std::string_view::npos) return {};
  const std::string_view rest = source.substr(at + marker.size());
  return std::string(rest.substr(0, rest.find_first_of("\\\n\"'")));
}

// Llama 3.1's template sets a fixed date ({%- set date_string = "26 Jul 2024" %}); Llama
// 3.2's asks for the current one through strftime_now and keeps that literal as a fallback.
std::string llama3_today_literal(std::string_view source) {
  if (contains(source, "strftime_now")) return {};  // the clock, at render time
  for (std::string_view marker : {"set date_string = \"", "set date_string = '"}) {
    std::string date = literal_after(source, marker);
    if (!date.empty()) return date;
  }
  return "26 Jul 2024";
}

// Today's local date as Python's strftime("%d %b %Y") writes it in the C locale ("02 Dec
// 2026"), which is what the template's strftime_now gives under Hugging Face transformers
// and llama.cpp. The month is spelled here, not by strftime, because the GUI sets a locale.
std::string today_local_date() {
  constexpr std::array<const char*, 12> kMonths = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                                   "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char text[32];
  std::snprintf(text, sizeof text, "%02d %s %04d", local.tm_mday, kMonths.at(local.tm_mon),
                local.tm_year + 1900);
  return text;
}

bool is_known_role(const std::string& role) {
  return role == "system" || role == "user" || role == "assistant";
}

void check_roles(const std::vector<ChatMessage>& messages, bool system_only_first,
                 std::string_view family) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (!is_known_role(role)) {
      throw UsageError("chat message " + std::to_string(i + 1) + " has role '" + role +
                       "'; expected system, user or assistant");
    }
    if (system_only_first && role == "system" && i != 0) {
      throw UsageError("the " + std::string(family) +
                       " chat format takes a system message only as the first message");
    }
  }
}

// Splits a leading system message off: returns its content (or "") and the first index
// of the remaining turns.
std::pair<std::string_view, size_t> leading_system(const std::vector<ChatMessage>& messages) {
  if (!messages.empty() && messages.front().role == "system") return {messages.front().content, 1};
  return {{}, 0};
}

// <|im_start|>role\ncontent<|im_end|>\n — content untouched.
std::string render_chatml(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                          const std::string& default_system) {
  std::string out;
  auto turn = [&out](std::string_view role, std::string_view content) {
    out.append("<|im_start|>").append(role).append("\n").append(content).append("<|im_end|>\n");
  };
  if (!default_system.empty() && !messages.empty() && messages.front().role != "system") {
    turn("system", default_system);
  }
  for (const ChatMessage& m : messages) turn(m.role, m.content);
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

// BOS, then <|start_header_id|>role<|end_header_id|>\n\ntrimmed content<|eot_id|>. Llama 3.1
// and later always open with a system turn holding the dates and then the (trimmed) system
// message, if any.
std::string render_llama3(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                          std::string_view bos_text, const std::string& knowledge_cutoff,
                          const std::string& today_date) {
  std::string out;
  size_t first = 0;
  if (!knowledge_cutoff.empty()) {
    const auto [system, first_turn] = leading_system(messages);
    first = first_turn;
    out.append(bos_text).append("<|start_header_id|>system<|end_header_id|>\n\n");
    out.append("Cutting Knowledge Date: ").append(knowledge_cutoff).append("\n");
    out.append("Today Date: ").append(today_date.empty() ? today_local_date() : today_date);
    out.append("\n\n").append(trim(system)).append("<|eot_id|>");
  } else if (!messages.empty()) {
    out += bos_text;
  }
  for (size_t i = first; i < messages.size(); ++i) {
    out.append("<|start_header_id|>").append(messages[i].role).append("<|end_header_id|>\n\n");
    out.append(trim(messages[i].content)).append("<|eot_id|>");
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// Every user turn is "BOS[INST] content [/INST]", every answer " content </s>"; the system
// prompt sits in a <<SYS>> block at the head of the first turn, and the whole turn is
// stripped. The format already ends in "[/INST]", so there is no generation prompt.
std::string render_llama2(const std::vector<ChatMessage>& messages, std::string_view bos_text) {
  const auto [system, first] = leading_system(messages);
  std::string out;
  for (size_t i = first; i < messages.size(); ++i) {
    std::string content = messages[i].content;
    if (i == first && first == 1) {
      content = "<<SYS>>\n" + std::string(system) + "\n<</SYS>>\n\n" + content;
    }
    if (messages[i].role == "user") {
      out.append(bos_text).append("[INST] ").append(trim(content)).append(" [/INST]");
    } else {
      out.append(" ").append(trim(content)).append(" </s>");
    }
  }
  return out;
}

// BOS, then "[INST] content [/INST]" and "answer</s>", nothing trimmed. Mistral's v0.1/v0.2
// template has no system turn: the system prompt goes before the first user message,
// separated by a blank line, as Mistral's later official templates do.
std::string render_mistral(const std::vector<ChatMessage>& messages, std::string_view bos_text) {
  const auto [system, first] = leading_system(messages);
  std::string out(bos_text);
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user") {
      out += "[INST] ";
      if (i == first && first == 1) out.append(system).append("\n\n");
      out.append(m.content).append(" [/INST]");
    } else {
      out.append(m.content).append("</s>");
    }
  }
  return out;
}

// BOS, then <start_of_turn>role\ncontent<end_of_turn>\n with "model" for the assistant and
// content trimmed; the system prompt plus a blank line prefixes the first turn (Gemma 3).
std::string render_gemma(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                         std::string_view bos_text) {
  const auto [system, first] = leading_system(messages);
  std::string out(bos_text);
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    out.append("<start_of_turn>").append(m.role == "assistant" ? "model" : m.role).append("\n");
    if (i == first && first == 1) out.append(system).append("\n\n");
    out.append(trim(m.content)).append("<end_of_turn>\n");
  }
  if (add_generation_prompt) out += "<start_of_turn>model\n";
  return out;
}

// BOS, then <|role|>\ncontent<|end|>\n, content untouched (Phi-3-mini's current template,
// which renders system turns; its first release wrote BOS itself and dropped them). Without a
// generation prompt the template closes the text with Phi-3's EOS, <|endoftext|>.
std::string render_phi3(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                        std::string_view bos_text) {
  std::string out(bos_text);
  for (const ChatMessage& m : messages) {
    out.append("<|").append(m.role).append("|>\n").append(m.content).append("<|end|>\n");
  }
  out += add_generation_prompt ? "<|assistant|>\n" : "<|endoftext|>";
  return out;
}

}  // namespace

// The hand-written family whose marker strings the source writes, if any. Markers are the
// format's own control strings, which every variant of a family writes literally; the order
// puts the most specific first (Llama 2's <<SYS>> before [INST]).
std::optional<ChatTemplate> ChatTemplate::recognise_family(std::string_view jinja_source) {
  ChatTemplate result(TemplateFamily::ChatML);
  if (contains(jinja_source, "<|im_start|>")) {
    result.default_system_ = find_chatml_default_system(jinja_source);
  } else if (contains(jinja_source, "<|start_header_id|>")) {
    result.family_ = TemplateFamily::Llama3;
    result.knowledge_cutoff_ = literal_after(jinja_source, "Cutting Knowledge Date: ");
    if (!result.knowledge_cutoff_.empty()) result.today_date_ = llama3_today_literal(jinja_source);
  } else if (contains(jinja_source, "<start_of_turn>")) {
    result.family_ = TemplateFamily::Gemma;
  } else if (contains(jinja_source, "<|end|>") &&
             (contains(jinja_source, "<|user|>") || contains(jinja_source, "<|assistant|>"))) {
    result.family_ = TemplateFamily::Phi3;
  } else if (contains(jinja_source, "[INST]")) {
    result.family_ =
        contains(jinja_source, "<<SYS>>") ? TemplateFamily::Llama2 : TemplateFamily::Mistral;
  } else {
    return std::nullopt;
  }
  return result;
}

ChatTemplate ChatTemplate::detect(std::string_view jinja_source) {
  if (trim(jinja_source).empty()) throw UnsupportedError("the chat template is empty");
  std::optional<ChatTemplate> family = recognise_family(jinja_source);
  ChatTemplate result = family ? *family : ChatTemplate(TemplateFamily::Jinja);
  // gpt-oss's harmony names its channels; Qwen3 and DeepSeek-R1 templates write <think>.
  if (contains(jinja_source, "<|channel|>")) {
    result.reasoning_ = ReasoningFormat::Harmony;
  } else if (contains(jinja_source, "<think>")) {
    result.reasoning_ = ReasoningFormat::Think;
  }
  result.reads_enable_thinking_ = contains(jinja_source, "enable_thinking");
  result.reads_reasoning_effort_ = contains(jinja_source, "reasoning_effort");
  const auto log = logger("engine.template");
  if (jinja_available()) {
    try {
      result.jinja_ = compile_jinja(jinja_source);
    } catch (const UnsupportedError& e) {
      if (!family) throw;
      log->warn("{}; rendering it as the {} family instead", e.what(), result.name());
    }
  } else if (!family) {
    throw UnsupportedError("unrecognised chat template: \"" + excerpt(jinja_source) +
                           "\", and this build has no Jinja engine to run it (run 'bash "
                           "packaging/setup.sh jinja' and rebuild, or choose one of chatml, "
                           "llama3, llama2, mistral, gemma, phi3)");
  }
  log->debug("chat template: {}{}{}", result.name(),
             result.jinja_ ? " (the model's own, Jinja)" : "",
             result.default_system_.empty() ? "" : " with a default system prompt");
  return result;
}

bool ChatTemplate::prompt_opens_reasoning(std::string_view prompt) const {
  if (reasoning_ != ReasoningFormat::Think) return false;
  const size_t end = prompt.find_last_not_of(" \t\r\n");
  return end != std::string_view::npos && prompt.substr(0, end + 1).ends_with("<think>");
}

ChatTemplate ChatTemplate::from_name(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const FamilyName& entry : kFamilyNames) {
    if (entry.name == lower) return ChatTemplate(entry.family);
  }
  std::string known;
  for (const FamilyName& entry : kFamilyNames)
    known += (known.empty() ? "" : ", ") + std::string(entry.name);
  throw UsageError("unknown chat template '" + std::string(name) + "' (known: " + known + ")");
}

std::vector<std::string> ChatTemplate::family_names() {
  std::vector<std::string> names;
  for (const FamilyName& entry : kFamilyNames) names.emplace_back(entry.name);
  return names;
}

std::string ChatTemplate::name() const {
  for (const FamilyName& entry : kFamilyNames) {
    if (entry.family == family_) return std::string(entry.name);
  }
  return "jinja";
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt, std::string_view bos_text,
                                 const ChatOptions& options) const {
  if (jinja_) {
    // The model's own template decides which roles and orders it takes (raise_exception).
    for (size_t i = 0; i < messages.size(); ++i) {
      const std::string& role = messages[i].role;
      if (!is_known_role(role) && role != "tool") {
        throw UsageError("chat message " + std::to_string(i + 1) + " has role '" + role +
                         "'; expected system, user, assistant or tool");
      }
    }
    if (family_ == TemplateFamily::Jinja) {
      return render_jinja(messages, add_generation_prompt, bos_text, options);
    }
    try {
      return render_jinja(messages, add_generation_prompt, bos_text, options);
    } catch (const UsageError& e) {
      // Older templates of a known family refuse what Granule's family renderer handles (a
      // system prompt for Mistral v0.1 or Gemma 1, merged into the first user turn): render
      // it as the family does instead of refusing the chat.
      logger("engine.template")->debug("{}; rendering as the {} family", e.what(), name());
    }
  }
  const bool system_only_first = family_ == TemplateFamily::Llama2 ||
                                 family_ == TemplateFamily::Mistral ||
                                 family_ == TemplateFamily::Gemma;
  check_roles(messages, system_only_first, name());
  switch (family_) {
    case TemplateFamily::ChatML:
      return render_chatml(messages, add_generation_prompt, default_system_);
    case TemplateFamily::Llama3:
      return render_llama3(messages, add_generation_prompt, bos_text, knowledge_cutoff_,
                           today_date_);
    case TemplateFamily::Llama2:
      return render_llama2(messages, bos_text);
    case TemplateFamily::Mistral:
      return render_mistral(messages, bos_text);
    case TemplateFamily::Gemma:
      return render_gemma(messages, add_generation_prompt, bos_text);
    case TemplateFamily::Phi3:
      return render_phi3(messages, add_generation_prompt, bos_text);
    case TemplateFamily::Jinja:
      break;  // never without a compiled template
  }
  throw UnsupportedError("this chat template needs the Jinja engine");
}

std::vector<std::string> ChatTemplate::stop_strings() const {
  switch (family_) {
    case TemplateFamily::ChatML:
      return {"<|im_end|>"};
    case TemplateFamily::Llama3:
      return {"<|eot_id|>"};
    case TemplateFamily::Llama2:
    case TemplateFamily::Mistral:
      return {"</s>"};
    case TemplateFamily::Gemma:
      return {"<end_of_turn>"};
    case TemplateFamily::Phi3:
      return {"<|end|>", "<|endoftext|>"};
    case TemplateFamily::Jinja:
      return {};  // the vocabulary's end-of-generation tokens end a turn
  }
  return {};
}

}  // namespace granule
