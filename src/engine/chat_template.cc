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

namespace {

// The rendered prompt as alternating parts: template tokens (special) and
// text (roles, content, separators). Adjacent text parts are merged so each
// text segment is tokenized exactly as HF tokenizers would after splitting
// the rendered string on special tokens.
struct PromptPart {
  bool special;
  std::string text;
};

void AddPart(std::vector<PromptPart>* parts, bool special, std::string_view text) {
  if (!special && !parts->empty() && !parts->back().special) {
    parts->back().text += text;
  } else {
    parts->push_back({special, std::string(text)});
  }
}

std::vector<PromptPart> RenderParts(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                                    bool add_generation_prompt) {
  std::vector<PromptPart> parts;
  switch (kind) {
    case ChatTemplateKind::kChatML:
      for (const ChatMessage& m : messages) {
        AddPart(&parts, true, "<|im_start|>");
        AddPart(&parts, false, m.role);
        AddPart(&parts, false, "\n");
        AddPart(&parts, false, m.content);
        AddPart(&parts, true, "<|im_end|>");
        AddPart(&parts, false, "\n");
      }
      if (add_generation_prompt) {
        AddPart(&parts, true, "<|im_start|>");
        AddPart(&parts, false, "assistant\n");
      }
      break;
    case ChatTemplateKind::kLlama3:
      AddPart(&parts, true, "<|begin_of_text|>");
      for (const ChatMessage& m : messages) {
        AddPart(&parts, true, "<|start_header_id|>");
        AddPart(&parts, false, m.role);
        AddPart(&parts, true, "<|end_header_id|>");
        AddPart(&parts, false, "\n\n");
        AddPart(&parts, false, m.content);
        AddPart(&parts, true, "<|eot_id|>");
      }
      if (add_generation_prompt) {
        AddPart(&parts, true, "<|start_header_id|>");
        AddPart(&parts, false, "assistant");
        AddPart(&parts, true, "<|end_header_id|>");
        AddPart(&parts, false, "\n\n");
      }
      break;
  }
  return parts;
}

}  // namespace

std::string ApplyChatTemplate(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                              bool add_generation_prompt) {
  std::string out;
  for (const PromptPart& p : RenderParts(kind, messages, add_generation_prompt)) out += p.text;
  return out;
}

std::vector<int32_t> EncodeChat(const Tokenizer& tokenizer, ChatTemplateKind kind,
                                const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt) {
  std::vector<int32_t> ids;
  for (const PromptPart& p : RenderParts(kind, messages, add_generation_prompt)) {
    if (p.special) {
      int32_t id = tokenizer.TokenId(p.text);
      if (id >= 0) {
        ids.push_back(id);
        continue;
      }
      // A template token the vocabulary lacks (e.g. no <|begin_of_text|>):
      // DetectChatTemplate guarantees the structural ones, so this is only
      // ever an optional token; it is tokenized as text like HF would.
    }
    std::vector<int32_t> piece = tokenizer.Encode(p.text, /*parse_special=*/false);
    ids.insert(ids.end(), piece.begin(), piece.end());
  }
  return ids;
}

std::string ChatEndOfTurnToken(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::kChatML: return "<|im_end|>";
    case ChatTemplateKind::kLlama3: return "<|eot_id|>";
  }
  return "";
}

}  // namespace arbiter
