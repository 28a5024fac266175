// Chat templates: render a conversation in the model's prompt format — the GGUF's own
// tokenizer.chat_template run by a Jinja engine where the engine was built with one, else one
// of the hand-written families recognised from it (ChatML, Llama 3, Llama 2 / Mistral [INST],
// Gemma, Phi-3), which are also the user's override names.
#pragma once
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace granule {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" ("tool" too with a Jinja template)
  std::string content;
  // Tool calling, rendered by a Jinja template: an assistant message's calls as a JSON array in
  // OpenAI's form ([{"id","type":"function","function":{"name","arguments"}}]), and a tool
  // message's call id and function name.
  std::string tool_calls_json = {};
  std::string tool_call_id = {};
  std::string name = {};
};

// Jinja: the model's own template, of no hand-written family (gpt-oss's harmony, ...).
enum class TemplateFamily { ChatML, Llama3, Llama2, Mistral, Gemma, Phi3, Jinja };

// How a model's answers carry their reasoning: Qwen3 / DeepSeek-R1 write <think>...</think>
// before the answer; gpt-oss writes harmony channels (analysis, then final).
enum class ReasoningFormat { None, Think, Harmony };

// The template variables a request may set besides the messages (llama-server's and vLLM's
// chat_template_kwargs). Unset ones are left undefined, so the template's defaults apply.
struct ChatOptions {
  std::optional<bool> enable_thinking;  // Qwen3: false asks for an answer without reasoning
  std::string reasoning_effort;         // gpt-oss: "low", "medium" or "high"; "" = default
  std::string tools_json;               // a JSON array of tool definitions, or ""
  // Text appended after the generation prompt, control tokens parsed: the start of the reply,
  // forced (the server's harmony tool-call header). Not rendered by render(); the engine adds it.
  std::string reply_prefix;
};

class ChatTemplate {
 public:
  // The model's template. With the Jinja engine built, compiles the source and renders with
  // it (the family, when one is recognised, still gives the stop strings); a source it cannot
  // compile falls back to its family. Throws UnsupportedError when neither works: a template
  // of no known family in a build without the Jinja engine, or one that neither compiles nor
  // is recognised.
  static ChatTemplate detect(std::string_view jinja_source);
  // Only the hand-written family the source's marker strings name (what detect() falls back
  // to), or nullopt.
  static std::optional<ChatTemplate> recognise_family(std::string_view jinja_source);
  // True when this build has the Jinja engine (setup.sh jinja before configuring).
  static bool jinja_available();
  // A family by name ("chatml", "llama3", "llama2", "mistral", "gemma", "phi3") — the user
  // override; throws UsageError for an unknown name.
  static ChatTemplate from_name(std::string_view name);
  static std::vector<std::string> family_names();

  TemplateFamily family() const { return family_; }
  // The family's name, or "jinja" for a template of no known family.
  std::string name() const;
  // True when render() runs the model's own template.
  bool uses_jinja() const { return jinja_ != nullptr; }
  ReasoningFormat reasoning_format() const { return reasoning_; }
  // Whether the template reads enable_thinking (Qwen3) / reasoning_effort (gpt-oss).
  bool reads_enable_thinking() const { return reads_enable_thinking_; }
  bool reads_reasoning_effort() const { return reads_reasoning_effort_; }
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
  // The clock a Jinja template's strftime_now reads; 0 = the time of each render.
  void set_now(std::time_t now) { now_ = now; }
  // The EOS token's text, which a Jinja template may write (eos_token).
  void set_eos_text(std::string eos_text) { eos_text_ = std::move(eos_text); }

  // The prompt text for these messages; add_generation_prompt appends the assistant
  // header so the model answers next. bos_text is prepended where the format has it (at
  // the start, except ChatML, which has none; Llama 2 before every user turn): pass the BOS
  // token's text and encode with parse_special and without add_bos to get exactly the
  // tokens the official template gives.
  // Throws UsageError for a role other than system/user/assistant, or a system message
  // after the start in a format that has no system turn (Llama 2, Mistral, Gemma); a Jinja
  // template's raise_exception and run-time errors are UsageErrors with its message.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     std::string_view bos_text = "", const ChatOptions& options = {}) const;
  // Whether a rendered prompt leaves the model inside its reasoning: the template opened
  // <think> itself (DeepSeek-R1, Qwen3 thinking variants), so the answer starts with reasoning.
  bool prompt_opens_reasoning(std::string_view prompt) const;
  // Strings that end an assistant turn in this format (besides EOS tokens).
  std::vector<std::string> stop_strings() const;

 private:
  struct Jinja;  // the compiled program (chat_template_jinja.cpp)

  explicit ChatTemplate(TemplateFamily f) : family_(f) {}
  // Throws UnsupportedError with the first line of the engine's complaint.
  static std::shared_ptr<const Jinja> compile_jinja(std::string_view source);
  std::string render_jinja(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                           std::string_view bos_text, const ChatOptions& options) const;

  TemplateFamily family_;
  std::shared_ptr<const Jinja> jinja_;  // shared: a compiled program is read-only
  ReasoningFormat reasoning_ = ReasoningFormat::None;
  bool reads_enable_thinking_ = false;
  bool reads_reasoning_effort_ = false;
  std::time_t now_ = 0;
  std::string eos_text_;
  std::string default_system_;
  std::string knowledge_cutoff_;
  std::string today_date_;  // "" = read the clock at render time
};

}  // namespace granule
