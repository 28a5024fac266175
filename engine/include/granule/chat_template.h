// Chat templates: render a conversation in the model's prompt format, chosen from the
// GGUF's tokenizer.chat_template (ChatML, Llama 3, Llama 2 / Mistral [INST], Gemma, Phi-3).
#pragma once
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace granule {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

enum class TemplateFamily { ChatML, Llama3, Llama2, Mistral, Gemma, Phi3 };

class ChatTemplate {
 public:
  // Recognises the family from the Jinja source; throws UnsupportedError("unrecognised
  // chat template ...") when it cannot.
  static ChatTemplate detect(std::string_view jinja_source);
  // A family by name ("chatml", "llama3", "llama2", "mistral", "gemma", "phi3") — the user
  // override; throws UsageError for an unknown name.
  static ChatTemplate from_name(std::string_view name);
  static std::vector<std::string> family_names();

  TemplateFamily family() const { return family_; }
  std::string name() const;
  // The system prompt the model's own template inserts when a conversation has none
  // (SmolLM2's and Qwen's ChatML templates do); "" when it inserts none.
  const std::string& default_system_prompt() const { return default_system_; }
  // Llama 3.1 and later open every prompt with a system turn that states the knowledge
  // cut-off and today's date; "" for formats without it (Llama 3.0 included).
  const std::string& knowledge_cutoff() const { return knowledge_cutoff_; }
  // The "Today Date" such a template writes: today's local date ("02 Dec 2026") where the
  // template asks for the current date (strftime_now, Llama 3.2+), else its literal date.
  // Setting it pins the date (tests, reproducible prompts).
  void set_today_date(std::string date_text) { today_date_ = std::move(date_text); }

  // The prompt text for these messages; add_generation_prompt appends the assistant
  // header so the model answers next. bos_text is prepended where the format has it (at
  // the start, except ChatML, which has none; Llama 2 before every user turn): pass the BOS
  // token's text and encode with parse_special and without add_bos to get exactly the
  // tokens the official template gives.
  // Throws UsageError for a role other than system/user/assistant, or a system message
  // after the start in a format that has no system turn (Llama 2, Mistral, Gemma).
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     std::string_view bos_text = "") const;
  // Strings that end an assistant turn in this format (besides EOS tokens).
  std::vector<std::string> stop_strings() const;

 private:
  explicit ChatTemplate(TemplateFamily f) : family_(f) {}
  TemplateFamily family_;
  std::string default_system_;
  std::string knowledge_cutoff_;
  std::string today_date_;  // "" = read the clock at render time
};

}  // namespace granule
