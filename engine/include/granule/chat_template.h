// Chat templates: render a conversation in the model's prompt format, chosen from the
// GGUF's tokenizer.chat_template (ChatML, Llama 3, Llama 2 / Mistral [INST], Gemma, Phi-3).
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace granule {

struct ChatMessage {
  std::string role;      // "system", "user", "assistant"
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
  // The prompt text for these messages; add_generation_prompt appends the assistant
  // header so the model answers next. bos_text is prepended where the format has it.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     std::string_view bos_text = "") const;
  // Strings that end an assistant turn in this format (besides EOS tokens).
  std::vector<std::string> stop_strings() const;

 private:
  explicit ChatTemplate(TemplateFamily f) : family_(f) {}
  TemplateFamily family_;
};

}  // namespace granule
