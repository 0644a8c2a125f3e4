// Chat templates (arbiter/engine/chat_template.h, docs/chat-templates.md).
// Each family's text is produced as its reference Jinja template renders
// it: ChatML, Llama-3 and Phi-3 keep contents verbatim; Llama-2 and Gemma
// strip them, as their templates do (`| trim`, `.strip()`).
#include "arbiter/engine/chat_template.h"

#include <array>
#include <string>

namespace arbiter {
namespace {

constexpr std::array<ChatTemplateKind, 6> kAllKinds = {
    ChatTemplateKind::kChatML, ChatTemplateKind::kLlama3, ChatTemplateKind::kLlama2,
    ChatTemplateKind::kMistral, ChatTemplateKind::kGemma,  ChatTemplateKind::kPhi3};

std::string NameList() {
  std::string names;
  for (ChatTemplateKind k : kAllKinds) {
    if (!names.empty()) names += ", ";
    names += "\"" + std::string(ChatTemplateName(k)) + "\"";
  }
  return names;
}

bool Contains(std::string_view text, std::string_view what) {
  return text.find(what) != std::string_view::npos;
}

// Python's str.strip() on ASCII whitespace.
std::string_view Strip(std::string_view s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

}  // namespace

std::string_view ChatTemplateName(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::kChatML: return "chatml";
    case ChatTemplateKind::kLlama3: return "llama3";
    case ChatTemplateKind::kLlama2: return "llama2";
    case ChatTemplateKind::kMistral: return "mistral";
    case ChatTemplateKind::kGemma: return "gemma";
    case ChatTemplateKind::kPhi3: return "phi3";
  }
  return "";
}

Result<ChatTemplateKind> ParseChatTemplateName(std::string_view name) {
  for (ChatTemplateKind k : kAllKinds) {
    if (ChatTemplateName(k) == name) return k;
  }
  return InvalidArgumentError("unknown chat template \"" + std::string(name) + "\"; one of " +
                              NameList());
}

std::optional<ChatTemplateKind> RecognizeChatTemplate(std::string_view t) {
  if (Contains(t, "<|im_start|>")) return ChatTemplateKind::kChatML;
  if (Contains(t, "<|start_header_id|>")) return ChatTemplateKind::kLlama3;
  if (Contains(t, "<start_of_turn>")) return ChatTemplateKind::kGemma;
  if (Contains(t, "<|user|>") && Contains(t, "<|end|>")) return ChatTemplateKind::kPhi3;
  if (Contains(t, "[INST]")) {
    return Contains(t, "<<SYS>>") ? ChatTemplateKind::kLlama2 : ChatTemplateKind::kMistral;
  }
  return std::nullopt;
}

Result<ChatTemplateKind> ChooseChatTemplate(const Tokenizer& tokenizer,
                                            std::string_view template_text,
                                            std::optional<ChatTemplateKind> override_kind) {
  if (override_kind) {
    const std::string eot = ChatEndOfTurnToken(*override_kind);
    if (tokenizer.TokenId(eot) < 0) {
      return FailedPreconditionError("chat_template = \"" +
                                     std::string(ChatTemplateName(*override_kind)) +
                                     "\" needs the token " + eot +
                                     ", which the model's tokenizer does not have");
    }
    return *override_kind;
  }
  if (!template_text.empty()) {
    if (std::optional<ChatTemplateKind> k = RecognizeChatTemplate(template_text)) return *k;
    return FailedPreconditionError(
        "the model's chat template is of no family arbiter renders (ChatML, Llama-3, "
        "Llama-2, Mistral, Gemma, Phi-3); set [[models]] chat_template to one of " +
        NameList() + " if one of them fits");
  }
  return DetectChatTemplate(tokenizer);
}

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
    case ChatTemplateKind::kLlama2:
    case ChatTemplateKind::kMistral: {
      // A leading system message goes into the first user message.
      const bool llama2 = kind == ChatTemplateKind::kLlama2;
      std::string system;
      size_t first = 0;
      if (!messages.empty() && messages[0].role == "system") {
        system = messages[0].content;
        first = 1;
      }
      bool system_pending = first == 1;
      for (size_t i = first; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "assistant") {
          if (llama2) {
            AddPart(&parts, false, " ");
            AddPart(&parts, false, Strip(m.content));
            AddPart(&parts, false, " ");
          } else {
            AddPart(&parts, false, m.content);
          }
          AddPart(&parts, true, "</s>");
          continue;
        }
        std::string content = m.content;
        if (system_pending) {
          content = llama2 ? "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content
                           : system + "\n\n" + content;
          system_pending = false;
        }
        if (llama2 || i == first) AddPart(&parts, true, "<s>");
        AddPart(&parts, false, "[INST] ");
        AddPart(&parts, false, llama2 ? std::string(Strip(content)) : content);
        AddPart(&parts, false, " [/INST]");
      }
      break;
    }
    case ChatTemplateKind::kGemma: {
      AddPart(&parts, true, "<bos>");
      std::string system;
      for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "system") {
          system += std::string(Strip(m.content)) + "\n\n";
          continue;
        }
        AddPart(&parts, true, "<start_of_turn>");
        AddPart(&parts, false, m.role == "assistant" ? "model" : "user");
        AddPart(&parts, false, "\n");
        AddPart(&parts, false, system + std::string(Strip(m.content)));
        system.clear();
        AddPart(&parts, true, "<end_of_turn>");
        AddPart(&parts, false, "\n");
      }
      if (add_generation_prompt) {
        AddPart(&parts, true, "<start_of_turn>");
        AddPart(&parts, false, "model\n");
      }
      break;
    }
    case ChatTemplateKind::kPhi3:
      for (const ChatMessage& m : messages) {
        const std::string role = m.role == "tool" ? "user" : m.role;
        AddPart(&parts, true, "<|" + role + "|>");
        AddPart(&parts, false, "\n");
        AddPart(&parts, false, m.content);
        AddPart(&parts, true, "<|end|>");
        AddPart(&parts, false, "\n");
      }
      if (add_generation_prompt) {
        AddPart(&parts, true, "<|assistant|>");
        AddPart(&parts, false, "\n");
      }
      break;
  }
  return parts;
}

// Template tokens that only mark the start of the text: skipped, not
// spelled out, when the vocabulary lacks them.
bool OptionalToken(std::string_view token) {
  return token == "<|begin_of_text|>" || token == "<s>" || token == "<bos>";
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
      // A template token the vocabulary lacks: a start-of-text token is
      // left out; any other is tokenized as text.
      if (OptionalToken(p.text)) continue;
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
    case ChatTemplateKind::kLlama2:
    case ChatTemplateKind::kMistral: return "</s>";
    case ChatTemplateKind::kGemma: return "<end_of_turn>";
    case ChatTemplateKind::kPhi3: return "<|end|>";
  }
  return "";
}

}  // namespace arbiter
