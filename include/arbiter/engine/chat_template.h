// arbiter/engine/chat_template.h — chat prompt formats.
//
// Two templates, chosen from the tokenizer's special tokens (see
// docs/chat-templates.md):
//   kChatML  (Qwen, many others) when "<|im_start|>" and "<|im_end|>" exist:
//            "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then
//            "<|im_start|>assistant\n" as the generation prompt.
//            Stop token: <|im_end|>.
//   kLlama3  when "<|start_header_id|>" and "<|eot_id|>" exist:
//            "<|begin_of_text|>" then
//            "<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>"
//            per message, then "<|start_header_id|>assistant<|end_header_id|>\n\n".
//            Stop token: <|eot_id|>.
// Neither present → kFailedPrecondition (the model has no chat format; use
// /v1/completions).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/engine/tokenizer.h"

namespace arbiter {

enum class ChatTemplateKind { kChatML, kLlama3 };

struct ChatMessage {
  std::string role;     // "system" | "user" | "assistant" | "tool"
  std::string content;
};

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
