// arbiter/engine/chat_template.h — chat prompt formats.
//
// arbiter does not run a model's Jinja chat_template: it recognizes the
// family the template belongs to and renders that family natively
// (docs/chat-templates.md has every format with an example):
//   kChatML  (Qwen, many others) "<|im_start|>{role}\n{content}<|im_end|>\n"
//            per message; generation prompt "<|im_start|>assistant\n";
//            end of turn <|im_end|>.
//   kLlama3  "<|begin_of_text|>" then "<|start_header_id|>{role}
//            <|end_header_id|>\n\n{content}<|eot_id|>" per message;
//            end of turn <|eot_id|>.
//   kLlama2  "<s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST]
//            {assistant} </s>" (contents stripped); end of turn </s>.
//   kMistral "<s>[INST] {user} [/INST]{assistant}</s>", a system message
//            prepended to the first user message; end of turn </s>.
//   kGemma   "<bos><start_of_turn>{user|model}\n{content}<end_of_turn>\n"
//            (contents stripped, a system message prepended to the first
//            user turn); generation prompt "<start_of_turn>model\n"; end of
//            turn <end_of_turn>.
//   kPhi3    "<|{role}|>\n{content}<|end|>\n"; generation prompt
//            "<|assistant|>\n"; end of turn <|end|>.
// The family comes from, in order: the `[[models]] chat_template` override;
// the model's own template text (tokenizer_config.json "chat_template" or
// GGUF "tokenizer.chat_template", RecognizeChatTemplate) — a template that
// matches no family is an error naming the override; without a template,
// the tokenizer's special tokens (DetectChatTemplate: ChatML or Llama-3).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <string>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/engine/tokenizer.h"

namespace arbiter {

enum class ChatTemplateKind { kChatML, kLlama3, kLlama2, kMistral, kGemma, kPhi3 };

// "chatml", "llama3", "llama2", "mistral", "gemma", "phi3".
std::string_view ChatTemplateName(ChatTemplateKind kind);
// The kind a name (as ChatTemplateName spells it) stands for.
// Errors: kInvalidArgument listing the names.
Result<ChatTemplateKind> ParseChatTemplateName(std::string_view name);

// The family a Jinja chat template belongs to, from the markers only that
// family writes (<|im_start|>, <|start_header_id|>, <start_of_turn>,
// <|user|> with <|end|>, [INST] with or without <<SYS>>); nullopt for a
// template of none of them.
std::optional<ChatTemplateKind> RecognizeChatTemplate(std::string_view template_text);

// The family a model chats in (see the file comment). `template_text` is
// empty when the model has none. Errors: kFailedPrecondition when the
// template is of no known family (the message names `[[models]]
// chat_template` and the families), when an override's end-of-turn token is
// missing from the tokenizer, or, without template and override, when the
// tokenizer has neither family's tokens (use /v1/completions).
Result<ChatTemplateKind> ChooseChatTemplate(const Tokenizer& tokenizer,
                                            std::string_view template_text,
                                            std::optional<ChatTemplateKind> override_kind);

// A function call the assistant made (OpenAI's message.tool_calls[]).
struct ToolCall {
  std::string id;         // "call_<hex>"; echoed back by the tool message
  std::string name;       // the function's name
  std::string arguments;  // a JSON object, as text
};

// A function the model may call (OpenAI's tools[].function).
struct ToolDefinition {
  std::string name;
  std::string description;
  std::string parameters;  // JSON schema of the arguments, as text ("" = none)
};

struct ChatMessage {
  std::string role;     // "system" | "user" | "assistant" | "tool"
  std::string content;
  std::vector<ToolCall> tool_calls = {};  // assistant: the calls it made
  std::string tool_call_id = {};          // tool: the call this answers
};

// From the tokenizer's special tokens alone: ChatML when <|im_start|> and
// <|im_end|> exist, else Llama-3 when <|start_header_id|> and <|eot_id|>
// exist, else kFailedPrecondition.
Result<ChatTemplateKind> DetectChatTemplate(const Tokenizer& tokenizer);
// The prompt text (special tokens written out; encode with parse_special).
std::string ApplyChatTemplate(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                              bool add_generation_prompt = true);
// The prompt as token ids, safe against template injection: template tokens
// map to their special ids, while roles and message contents are tokenized
// as plain text (parse_special=false), so a user who writes "<|im_start|>"
// in a message gets those characters, not the control token. For content
// without special-token text the ids equal
// tokenizer.Encode(ApplyChatTemplate(...), true), as HF tokenizers produce.
std::vector<int32_t> EncodeChat(const Tokenizer& tokenizer, ChatTemplateKind kind,
                                const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt = true);

// The template's end-of-turn token string, e.g. "<|im_end|>".
std::string ChatEndOfTurnToken(ChatTemplateKind kind);

}  // namespace arbiter
