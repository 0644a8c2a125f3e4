// Chat templates: ChatML and Llama-3, chosen from the tokenizer's special
// tokens (docs/chat-templates.md). The text is produced exactly as the HF
// Jinja templates that model_maker writes into tokenizer_config.json would
// render it (content verbatim, no trimming).
#include "arbiter/engine/chat_template.h"

namespace arbiter {

Result<ChatTemplateKind> DetectChatTemplate(const Tokenizer& tokenizer) {
  if (tokenizer.TokenId("<|im_start|>") >= 0 && tokenizer.TokenId("<|im_end|>") >= 0) {
    return ChatTemplateKind::kChatML;
  }
  if (tokenizer.TokenId("<|start_header_id|>") >= 0 && tokenizer.TokenId("<|eot_id|>") >= 0) {
    return ChatTemplateKind::kLlama3;
  }
  return FailedPreconditionError(
      "the model's tokenizer has no known chat format (no <|im_start|>/<|im_end|> tokens for "
      "ChatML, no <|start_header_id|>/<|eot_id|> tokens for Llama-3); use /v1/completions "
      "with a raw prompt instead");
}

std::string ApplyChatTemplate(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                              bool add_generation_prompt) {
  std::string out;
  switch (kind) {
    case ChatTemplateKind::kChatML:
      for (const ChatMessage& m : messages) {
        out += "<|im_start|>";
        out += m.role;
        out += "\n";
        out += m.content;
        out += "<|im_end|>\n";
      }
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      break;
    case ChatTemplateKind::kLlama3:
      out += "<|begin_of_text|>";
      for (const ChatMessage& m : messages) {
        out += "<|start_header_id|>";
        out += m.role;
        out += "<|end_header_id|>\n\n";
        out += m.content;
        out += "<|eot_id|>";
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
  }
  return out;
}

std::string ChatEndOfTurnToken(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::kChatML: return "<|im_end|>";
    case ChatTemplateKind::kLlama3: return "<|eot_id|>";
  }
  return "";
}

}  // namespace arbiter
