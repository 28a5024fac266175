// ChatTemplate: family detection from real Jinja sources, rendering against golden outputs
// (the Jinja engine where built, and the hand-written families), the template variables
// (enable_thinking, reasoning_effort, tools), the user override by name, and the errors for
// unknown templates, names, roles and a template's raise_exception.
//
// The golden files tests/data/chat/<template>.<case>.txt were made by rendering each model's
// real Jinja template (tests/data/chat/<template>.jinja) with Python's jinja2, configured as
// Hugging Face transformers configures it: tests/reference/make_chat_goldens.py.
#include "granule/chat_template.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "granule/error.h"
#include "granule/gguf.h"
#include "support/test_files.h"

namespace granule {
namespace {

const std::filesystem::path kChatData =
    std::filesystem::path(GRANULE_SOURCE_DIR) / "tests/data/chat";

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

using granule::test::default_model_path;

// The conversations of make_chat_goldens.py's CASES, in the same order and bytes.
struct Conversation {
  std::string name;
  std::vector<ChatMessage> messages;
  bool add_generation_prompt;
};

std::vector<Conversation> conversations() {
  const ChatMessage system{"system", "You are a helpful assistant"};
  return {
      {"multiturn_system",
       {system,
        {"user", "Hello"},
        {"assistant", "Hi there"},
        {"user", "Who are you"},
        {"assistant", "   I am an assistant   "},
        {"user", "Another question \xc3\xa9\xe2\x98\x83"}},
       true},
      {"system_user", {system, {"user", " Why is the sky blue?\n"}}, true},
      {"no_system", {{"user", "Hello"}, {"assistant", "Hi there"}, {"user", "Who are you"}}, true},
      {"no_generation_prompt", {{"user", "Hello"}, {"assistant", "Hi there"}}, false},
  };
}

// make_chat_goldens.py's EXTRA_CASES: a conversation of CASES with template variables set.
struct ExtraCase {
  std::string name;
  std::string conversation;
  ChatOptions options;
};

std::vector<ExtraCase> extra_cases() {
  ChatOptions no_thinking;
  no_thinking.enable_thinking = false;
  ChatOptions effort_high;
  effort_high.reasoning_effort = "high";
  ChatOptions effort_low;
  effort_low.reasoning_effort = "low";
  ChatOptions tools;
  tools.tools_json =
      R"([{"type": "function", "function": {"name": "get_weather", "description": "The current )"
      R"(weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": )"
      R"("string", "description": "The city's name"}}, "required": ["city"]}}}])";
  return {{"no_thinking", "system_user", no_thinking},
          {"effort_high", "system_user", effort_high},
          {"effort_low", "no_system", effort_low},
          {"tools", "system_user", tools}};
}

// The moment make_chat_goldens.py's strftime_now gives: 2 Dec 2026, local noon.
std::time_t golden_now() {
  std::tm local{};
  local.tm_year = 2026 - 1900;
  local.tm_mon = 11;
  local.tm_mday = 2;
  local.tm_hour = 12;
  local.tm_isdst = -1;
  return std::mktime(&local);
}

// One real template source, the family it must be detected as, and the BOS and EOS texts
// the golden renderings were made with.
struct TemplateCase {
  std::string file;
  TemplateFamily family;
  std::string bos_text;
  std::string eos_text;
  std::string today_date = "";  // the date strftime_now gave the Jinja (Llama 3.2)
  bool needs_jinja = false;     // no hand-written family renders it (or all its cases)
};

class ChatTemplateGolden : public testing::TestWithParam<TemplateCase> {};

TEST_P(ChatTemplateGolden, DetectsFamilyAndRendersEveryConversationAsTheJinjaDoes) {
  const TemplateCase& c = GetParam();
  if (c.needs_jinja && !ChatTemplate::jinja_available())
    GTEST_SKIP() << "this build has no Jinja engine (setup.sh jinja)";
  ChatTemplate tmpl = ChatTemplate::detect(read_file(kChatData / (c.file + ".jinja")));
  EXPECT_EQ(tmpl.family(), c.family);
  EXPECT_EQ(tmpl.uses_jinja(), ChatTemplate::jinja_available());
  if (!c.today_date.empty()) tmpl.set_today_date(c.today_date);
  tmpl.set_now(golden_now());
  tmpl.set_eos_text(c.eos_text);
  int compared = 0;
  for (const ExtraCase& extra : extra_cases()) {
    const std::filesystem::path golden = kChatData / (c.file + "." + extra.name + ".txt");
    if (!std::filesystem::exists(golden)) continue;
    SCOPED_TRACE(c.file + "." + extra.name);
    for (const Conversation& conv : conversations()) {
      if (conv.name != extra.conversation) continue;
      EXPECT_EQ(tmpl.render(conv.messages, conv.add_generation_prompt, c.bos_text, extra.options),
                read_file(golden));
      ++compared;
    }
  }
  for (const Conversation& conv : conversations()) {
    // A template that cannot express a conversation (one that drops system messages) has
    // no golden file for it.
    const std::filesystem::path golden = kChatData / (c.file + "." + conv.name + ".txt");
    if (!std::filesystem::exists(golden)) continue;
    SCOPED_TRACE(c.file + "." + conv.name);
    EXPECT_EQ(tmpl.render(conv.messages, conv.add_generation_prompt, c.bos_text),
              read_file(golden));
    ++compared;
  }
  EXPECT_GT(compared, 0) << "no golden files for " << c.file;
}

// How gtest shows a case (--gtest_list_tests, failure messages): the template and its BOS.
void PrintTo(const TemplateCase& c, std::ostream* os) {
  *os << c.file << ".jinja, BOS \"" << c.bos_text << '"';
}

INSTANTIATE_TEST_SUITE_P(
    RealTemplates, ChatTemplateGolden,
    testing::Values(
        TemplateCase{"smollm2", TemplateFamily::ChatML, "<|im_start|>", "<|im_end|>"},
        TemplateCase{"chatml", TemplateFamily::ChatML, "<s>", "</s>"},
        TemplateCase{"llama3", TemplateFamily::Llama3, "<|begin_of_text|>", "<|eot_id|>"},
        TemplateCase{"llama32", TemplateFamily::Llama3, "<|begin_of_text|>", "<|eot_id|>",
                     "02 Dec 2026"},
        TemplateCase{"llama2", TemplateFamily::Llama2, "<s>", "</s>"},
        TemplateCase{"mistral", TemplateFamily::Mistral, "<s>", "</s>"},
        TemplateCase{"gemma", TemplateFamily::Gemma, "<bos>", "<eos>"},
        // Phi-3-mini's current template writes no BOS; its first one did.
        TemplateCase{"phi3", TemplateFamily::Phi3, "", "<|endoftext|>"},
        TemplateCase{"phi3_gguf", TemplateFamily::Phi3, "<s>", "<|endoftext|>"},
        // The real templates from llama.cpp's models/templates/, run by the Jinja engine.
        TemplateCase{"qwen3", TemplateFamily::ChatML, "", "<|im_end|>", "", true},
        TemplateCase{"gpt_oss", TemplateFamily::Jinja, "<|startoftext|>", "<|return|>", "", true},
        TemplateCase{"llama31", TemplateFamily::Llama3, "<|begin_of_text|>", "<|eot_id|>", "",
                     true},
        TemplateCase{"mistral_nemo", TemplateFamily::Mistral, "<s>", "</s>", "", true}),
    [](const testing::TestParamInfo<TemplateCase>& info) { return info.param.file; });

// The default model's template through the Jinja engine and through the hand-written ChatML
// family: the same bytes for every conversation, so replacing one by the other changes no
// prompt (and no KV kept across turns).
TEST(ChatTemplate, SmolLM2RendersTheSameWithJinjaAndTheHandWrittenFamily) {
  if (!ChatTemplate::jinja_available()) GTEST_SKIP() << "this build has no Jinja engine";
  const std::string source = read_file(kChatData / "smollm2.jinja");
  const ChatTemplate jinja = ChatTemplate::detect(source);
  ASSERT_TRUE(jinja.uses_jinja());
  const std::optional<ChatTemplate> family = ChatTemplate::recognise_family(source);
  ASSERT_TRUE(family.has_value());
  ASSERT_FALSE(family->uses_jinja());
  std::vector<Conversation> all = conversations();
  all.push_back({"one user message", {{"user", "Hi"}}, true});
  all.push_back({"system only", {{"system", "Be brief."}}, true});
  for (const Conversation& conv : all) {
    SCOPED_TRACE(conv.name);
    EXPECT_EQ(jinja.render(conv.messages, conv.add_generation_prompt, "<|im_start|>"),
              family->render(conv.messages, conv.add_generation_prompt, "<|im_start|>"));
  }
}

TEST(ChatTemplate, ReasoningFormatAndVariablesAreReadFromTheSource) {
  const ChatTemplate qwen3 = ChatTemplate::detect(read_file(kChatData / "qwen3.jinja"));
  EXPECT_EQ(qwen3.reasoning_format(), ReasoningFormat::Think);
  EXPECT_TRUE(qwen3.reads_enable_thinking());
  EXPECT_FALSE(qwen3.reads_reasoning_effort());
  EXPECT_EQ(qwen3.stop_strings(), std::vector<std::string>{"<|im_end|>"});
  const ChatTemplate smollm2 = ChatTemplate::detect(read_file(kChatData / "smollm2.jinja"));
  EXPECT_EQ(smollm2.reasoning_format(), ReasoningFormat::None);
  EXPECT_FALSE(smollm2.reads_enable_thinking());
  if (!ChatTemplate::jinja_available()) return;  // gpt-oss has no hand-written family
  const ChatTemplate gpt_oss = ChatTemplate::detect(read_file(kChatData / "gpt_oss.jinja"));
  EXPECT_EQ(gpt_oss.reasoning_format(), ReasoningFormat::Harmony);
  EXPECT_TRUE(gpt_oss.reads_reasoning_effort());
  EXPECT_EQ(gpt_oss.name(), "jinja");
  // Harmony's turn ends are the vocabulary's end-of-generation tokens (<|return|>, <|call|>);
  // <|end|> closes the analysis channel and must not stop the reply.
  EXPECT_TRUE(gpt_oss.stop_strings().empty());
}

TEST(ChatTemplate, PromptOpensReasoningOnlyWhenItEndsInAThinkTag) {
  const ChatTemplate qwen3 = ChatTemplate::detect(read_file(kChatData / "qwen3.jinja"));
  EXPECT_TRUE(qwen3.prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(qwen3.prompt_opens_reasoning("<|im_start|>assistant\n"));
  EXPECT_FALSE(qwen3.prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(ChatTemplate::from_name("chatml").prompt_opens_reasoning("<think>\n"));
}

TEST(ChatTemplate, AJinjaTemplatesRaiseExceptionIsAUsageErrorWithItsMessage) {
  if (!ChatTemplate::jinja_available()) GTEST_SKIP() << "this build has no Jinja engine";
  const ChatTemplate gpt_oss = ChatTemplate::detect(read_file(kChatData / "gpt_oss.jinja"));
  const std::vector<ChatMessage> chat = {
      {"user", "Hi"}, {"assistant", "<|channel|>final<|message|>Hello"}, {"user", "Again"}};
  try {
    (void)gpt_oss.render(chat, true);
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("the model's chat template refuses this conversation: ", 0), 0u)
        << message;
    EXPECT_NE(message.find("<|channel|> tags in the content field"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  EXPECT_THROW((void)gpt_oss.render({{"user", "Hi"}}, true, "", {.tools_json = "{not json"}),
               UsageError);
}

TEST(ChatTemplate, ATemplateThatDoesNotCompileFallsBackToItsFamilyOrIsUnsupported) {
  if (!ChatTemplate::jinja_available()) GTEST_SKIP() << "this build has no Jinja engine";
  // A ChatML marker in a broken template: rendered as the family.
  const ChatTemplate chatml = ChatTemplate::detect("{% if %}<|im_start|>");
  EXPECT_FALSE(chatml.uses_jinja());
  EXPECT_EQ(chatml.family(), TemplateFamily::ChatML);
  try {
    (void)ChatTemplate::detect("{% for x in %}USER: {{ x }}");
    FAIL() << "expected UnsupportedError";
  } catch (const UnsupportedError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("the chat template does not compile: ", 0), 0u) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST(ChatTemplate, SmolLM2TemplateInjectsItsDefaultSystemPromptOnlyWithoutASystemMessage) {
  const ChatTemplate tmpl = ChatTemplate::detect(read_file(kChatData / "smollm2.jinja"));
  EXPECT_EQ(tmpl.default_system_prompt(),
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  const std::string with_default = tmpl.render({{"user", "Hi"}}, true);
  EXPECT_EQ(with_default,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  const std::string with_own = tmpl.render({{"system", "Be brief."}, {"user", "Hi"}}, true);
  EXPECT_EQ(with_own.find("SmolLM"), std::string::npos);
}

TEST(ChatTemplate, PlainChatMLHasNoDefaultSystemPrompt) {
  const ChatTemplate tmpl = ChatTemplate::detect(read_file(kChatData / "chatml.jinja"));
  EXPECT_EQ(tmpl.default_system_prompt(), "");
  EXPECT_EQ(tmpl.render({{"user", "Hi"}}, true),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, ChatMLDefaultSystemWithEscapedNewlinesIsUnescaped) {
  // The same shape as Qwen2.5's template, whose GGUF text keeps "\n" as an escape inside
  // the Jinja string literal.
  const std::string source =
      "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + "
      "messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are "
      "Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}";
  EXPECT_EQ(ChatTemplate::detect(source).default_system_prompt(),
            "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
}

// Further real sources, each only for detection (from llama.cpp's test-chat-template.cpp).
TEST(ChatTemplate, Llama30HasNoDatedSystemTurn) {
  const ChatTemplate tmpl = ChatTemplate::detect(read_file(kChatData / "llama3.jinja"));
  EXPECT_EQ(tmpl.knowledge_cutoff(), "");
  EXPECT_EQ(tmpl.render({{"user", "Hi"}}, true).find("Cutting Knowledge"), std::string::npos);
}

std::string local_date_now() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char text[32];
  std::strftime(text, sizeof text, "%d %b %Y", &local);
  return text;
}

TEST(ChatTemplate, Llama32WritesTodaysDateWhenNotPinned) {
  const ChatTemplate tmpl = ChatTemplate::detect(read_file(kChatData / "llama32.jinja"));
  EXPECT_EQ(tmpl.knowledge_cutoff(), "December 2023");
  const std::string before = local_date_now();
  const std::string text = tmpl.render({{"user", "Hi"}}, true);
  const std::string after = local_date_now();  // the same unless midnight passed
  EXPECT_TRUE(text.find("Today Date: " + before + "\n\n") != std::string::npos ||
              text.find("Today Date: " + after + "\n\n") != std::string::npos)
      << text;
}

TEST(ChatTemplate, Llama31UsesTheTemplatesFixedDate) {
  // The date lines of meta-llama/Llama-3.1-8B-Instruct's template (an excerpt).
  const std::string source =
      "{{- bos_token }}\n{%- if not date_string is defined %}\n    {%- set date_string = \"26 Jul "
      "2024\" %}\n{%- endif %}\n{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n{{- "
      "\"Cutting Knowledge Date: December 2023\\n\" }}\n{{- \"Today Date: \" + date_string + "
      "\"\\n\\n\" }}\n";
  // The hand-written family (the excerpt has no message loop for the Jinja engine to run).
  const ChatTemplate tmpl = *ChatTemplate::recognise_family(source);
  EXPECT_EQ(tmpl.family(), TemplateFamily::Llama3);
  EXPECT_EQ(tmpl.knowledge_cutoff(), "December 2023");
  EXPECT_EQ(
      tmpl.render({{"system", " Be brief. "}, {"user", "Hi"}}, true, "<|begin_of_text|>"),
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "
      "December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|><|start_header_id|>user<|"
      "end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
}

// The templates stored in real GGUF files, read through ModelFile.
TEST(ChatTemplate, DetectsTheTemplatesOfRealGgufFiles) {
  const std::filesystem::path phi3_vocab =
      std::filesystem::path(GRANULE_TESTDATA_DIR) / "tokenizer/ggml-vocab-phi-3.gguf";
  if (!std::filesystem::exists(phi3_vocab))
    GTEST_SKIP() << phi3_vocab << " is absent: `bash packaging/setup.sh testdata` fetches it";
  const auto phi3 = ModelFile::open(phi3_vocab);
  const std::optional<std::string> source = phi3->get_string("tokenizer.chat_template");
  ASSERT_TRUE(source.has_value());
  EXPECT_EQ(*source, read_file(kChatData / "phi3_gguf.jinja"));
  EXPECT_EQ(ChatTemplate::detect(*source).family(), TemplateFamily::Phi3);
}

TEST(ChatTemplate, DetectsTheDefaultModelsTemplateWithItsDefaultSystemPrompt) {
  const std::filesystem::path model = default_model_path();
  if (model.empty()) GTEST_SKIP() << test::kNoDefaultModel;
  const auto file = ModelFile::open(model);
  const std::optional<std::string> source = file->get_string("tokenizer.chat_template");
  ASSERT_TRUE(source.has_value());
  EXPECT_EQ(*source, read_file(kChatData / "smollm2.jinja"));
  const ChatTemplate tmpl = ChatTemplate::detect(*source);
  EXPECT_EQ(tmpl.family(), TemplateFamily::ChatML);
  EXPECT_EQ(tmpl.default_system_prompt(),
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
}

TEST(ChatTemplate, DetectsFamilyFromOtherRealTemplateVariants) {
  struct Variant {
    const char* what;
    std::string source;
    TemplateFamily family;
  };
  const std::vector<Variant> variants = {
      {"google/gemma-7b-it",
       "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') "
       "}}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != "
       "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
       "user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') "
       "%}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ "
       "'<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% "
       "endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}",
       TemplateFamily::Gemma},
      {"Phi-3 with role concatenation (no literal <|user|>)",
       "{{ bos_token }}{% for message in messages %}{{'<|' + message['role'] + '|>' + '\n' + "
       "message['content'] + '<|end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ "
       "'<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}",
       TemplateFamily::Phi3},
      {"bofenghuang/vigogne-2-70b-chat (Llama 2 with a default system prompt)",
       "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set loop_messages = "
       "messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set "
       "loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in "
       "loop_messages %}{% if loop.index0 == 0 and system_message != false %}{% set content = "
       "'<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% "
       "set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ "
       "'[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' "
       "'  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}",
       TemplateFamily::Llama2},
      {"Mistral-7B-Instruct-v0.2 (later revision, system before the first user message)",
       "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = "
       "messages[0]['content'] %}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    "
       "{%- set loop_messages = messages %}\n{%- endif %}\n\n{{- bos_token }}\n{%- for message in "
       "loop_messages %}\n    {%- if message['role'] == 'user' %}\n        {%- if loop.first and "
       "system_message is defined %}\n            {{- ' [INST] ' + system_message + '\\n\\n' + "
       "message['content'] + ' [/INST]' }}\n        {%- else %}\n            {{- ' [INST] ' + "
       "message['content'] + ' [/INST]' }}\n        {%- endif %}\n    {%- elif message['role'] == "
       "'assistant' %}\n        {{- ' ' + message['content'] + eos_token}}\n    {%- endif %}\n{%- "
       "endfor %}\n",
       TemplateFamily::Mistral},
      {"Llama 3 without an add_generation_prompt test (llama.cpp's copy)",
       "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
       "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
       "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% "
       "endif %}{{ content }}{% endfor %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}",
       TemplateFamily::Llama3},
  };
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.what);
    EXPECT_EQ(ChatTemplate::detect(v.source).family(), v.family);
  }
}

TEST(ChatTemplate, UnknownTemplateRendersWithJinjaOrThrowsUnsupportedWithAOneLineExcerpt) {
  const std::string vicuna =
      "{%- for message in messages %}{%- if message['role'] == 'system' -%}{{- '' + "
      "message['content'] + '\n\n' -}}{%- else -%}{%- if message['role'] == 'user' -%}{{-'USER: "
      "' + message['content'] + '\n'-}}{%- else -%}{{-'ASSISTANT: ' + message['content'] + "
      "'</s>\n' -}}{%- endif -%}{%- endif -%}{%- endfor -%}";
  EXPECT_THROW(ChatTemplate::detect(""), UnsupportedError);
  EXPECT_THROW(ChatTemplate::detect(" \n "), UnsupportedError);
  if (ChatTemplate::jinja_available()) {
    const ChatTemplate tmpl = ChatTemplate::detect(vicuna);
    EXPECT_EQ(tmpl.family(), TemplateFamily::Jinja);
    EXPECT_EQ(tmpl.render({{"system", "S"}, {"user", "Hi"}, {"assistant", "Yo"}}, false),
              "S\n\nUSER: Hi\nASSISTANT: Yo</s>\n");
    return;
  }
  try {
    ChatTemplate::detect(vicuna);
    FAIL() << "expected UnsupportedError";
  } catch (const UnsupportedError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("unrecognised chat template: ", 0), 0u) << message;
    EXPECT_NE(message.find("{%- for message in messages %}"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_NE(message.find("no Jinja engine"), std::string::npos) << message;
    EXPECT_LT(message.size(), 300u) << message;
  }
}

TEST(ChatTemplate, FromNameCoversEveryFamilyAndRoundTrips) {
  const std::vector<std::string> names = ChatTemplate::family_names();
  ASSERT_EQ(names,
            (std::vector<std::string>{"chatml", "llama3", "llama2", "mistral", "gemma", "phi3"}));
  const std::vector<TemplateFamily> families = {TemplateFamily::ChatML, TemplateFamily::Llama3,
                                                TemplateFamily::Llama2, TemplateFamily::Mistral,
                                                TemplateFamily::Gemma,  TemplateFamily::Phi3};
  for (size_t i = 0; i < names.size(); ++i) {
    const ChatTemplate tmpl = ChatTemplate::from_name(names[i]);
    EXPECT_EQ(tmpl.family(), families[i]);
    EXPECT_EQ(tmpl.name(), names[i]);
    EXPECT_EQ(tmpl.default_system_prompt(), "");
  }
  EXPECT_EQ(ChatTemplate::from_name("ChatML").family(), TemplateFamily::ChatML);
}

TEST(ChatTemplate, FromNameRejectsUnknownNameListingTheKnownOnes) {
  try {
    ChatTemplate::from_name("vicuna");
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("'vicuna'"), std::string::npos) << message;
    EXPECT_NE(message.find("chatml, llama3, llama2, mistral, gemma, phi3"), std::string::npos)
        << message;
  }
}

TEST(ChatTemplate, StopStringsEndTheAssistantTurnOfEachFamily) {
  auto stops = [](const char* name) { return ChatTemplate::from_name(name).stop_strings(); };
  EXPECT_EQ(stops("chatml"), std::vector<std::string>{"<|im_end|>"});
  EXPECT_EQ(stops("llama3"), std::vector<std::string>{"<|eot_id|>"});
  EXPECT_EQ(stops("llama2"), std::vector<std::string>{"</s>"});
  EXPECT_EQ(stops("mistral"), std::vector<std::string>{"</s>"});
  EXPECT_EQ(stops("gemma"), std::vector<std::string>{"<end_of_turn>"});
  EXPECT_EQ(stops("phi3"), (std::vector<std::string>{"<|end|>", "<|endoftext|>"}));
}

TEST(ChatTemplate, Llama2WritesBosBeforeEveryUserTurnOnlyWhenGiven) {
  const ChatTemplate tmpl = ChatTemplate::from_name("llama2");
  const std::vector<ChatMessage> chat = {{"user", "a"}, {"assistant", "b"}, {"user", "c"}};
  EXPECT_EQ(tmpl.render(chat, true, "<s>"), "<s>[INST] a [/INST] b </s><s>[INST] c [/INST]");
  EXPECT_EQ(tmpl.render(chat, true), "[INST] a [/INST] b </s>[INST] c [/INST]");
}

TEST(ChatTemplate, UnknownRoleIsAUsageError) {
  EXPECT_THROW(ChatTemplate::from_name("chatml").render({{"tool", "42"}}, true), UsageError);
}

TEST(ChatTemplate, LateSystemMessageIsRejectedOnlyByFormatsWithoutASystemTurn) {
  const std::vector<ChatMessage> chat = {{"user", "a"}, {"system", "be brief"}, {"user", "c"}};
  EXPECT_THROW(ChatTemplate::from_name("gemma").render(chat, true), UsageError);
  EXPECT_THROW(ChatTemplate::from_name("mistral").render(chat, true), UsageError);
  EXPECT_THROW(ChatTemplate::from_name("llama2").render(chat, true), UsageError);
  EXPECT_NE(
      ChatTemplate::from_name("chatml").render(chat, true).find("<|im_start|>system\nbe brief"),
      std::string::npos);
  EXPECT_NE(ChatTemplate::from_name("phi3").render(chat, true).find("<|system|>\nbe brief"),
            std::string::npos);
}

}  // namespace
}  // namespace granule
