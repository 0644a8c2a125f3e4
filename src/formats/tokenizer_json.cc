// tokenizer.json reader.
//
// The parse is strict about the parts we use and lenient about the rest:
// every field we read is type-checked and a mismatch is kDataLoss naming the
// field path ("model.merges[12]"); fields we do not use are ignored, so files
// from newer `tokenizers` releases still load. nlohmann::json exceptions never
// escape: the JSON is parsed with exceptions caught at this boundary, and
// all later accesses check types first.
#include "arbiter/formats/tokenizer_json.h"

#include <nlohmann/json.hpp>

#include <unordered_map>
#include <unordered_set>

#include "arbiter/base/file.h"

namespace arbiter {

const char kGpt2SplitRegex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

namespace {

using Json = nlohmann::json;

// Largest token id accepted (2^21 − 1). Real vocabularies stay below ~300K;
// the cap keeps a corrupt id from making the tokenizer allocate an id table
// of billions of entries.
constexpr int64_t kMaxTokenId = (1 << 21) - 1;

class Parser {
 public:
  explicit Parser(const std::string& name) : name_(name) {}

  Status Bad(const std::string& field, const std::string& what) const {
    return DataLossError(name_ + ": field \"" + field + "\" " + what);
  }
  Status Unsupported(const std::string& field, const std::string& what) const {
    return UnimplementedError(name_ + ": field \"" + field + "\" " + what);
  }

  // Optional bool: absent or null → `def`.
  Result<bool> Bool(const Json& obj, const char* key, const std::string& path, bool def) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return def;
    if (!it->is_boolean()) return Bad(path + "." + key, "must be a boolean");
    return it->get<bool>();
  }
  // Optional string: absent or null → `def`.
  Result<std::string> Str(const Json& obj, const char* key, const std::string& path,
                          const std::string& def) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return def;
    if (!it->is_string()) return Bad(path + "." + key, "must be a string");
    return it->get<std::string>();
  }
  Result<std::string> RequiredStr(const Json& obj, const char* key, const std::string& path) const {
    auto it = obj.find(key);
    if (it == obj.end() || !it->is_string()) return Bad(path + "." + key, "must be a string");
    return it->get<std::string>();
  }
  Result<int> Int(const Json& obj, const char* key, const std::string& path, int def) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return def;
    if (!it->is_number_integer()) return Bad(path + "." + key, "must be an integer");
    int64_t v = it->get<int64_t>();
    if (v < 0 || v > (1 << 20)) return Bad(path + "." + key, "is out of range");
    return static_cast<int>(v);
  }

  // {"String": "..."} or {"Regex": "..."}.
  Status Pattern(const Json& obj, const std::string& path, std::string* pattern,
                 bool* is_regex) const {
    auto it = obj.find("pattern");
    if (it == obj.end() || !it->is_object() || it->size() != 1) {
      return Bad(path + ".pattern", "must be an object {\"String\": ...} or {\"Regex\": ...}");
    }
    if (auto s = it->find("String"); s != it->end()) {
      if (!s->is_string()) return Bad(path + ".pattern.String", "must be a string");
      *pattern = s->get<std::string>();
      *is_regex = false;
      return OkStatus();
    }
    if (auto r = it->find("Regex"); r != it->end()) {
      if (!r->is_string()) return Bad(path + ".pattern.Regex", "must be a string");
      *pattern = r->get<std::string>();
      *is_regex = true;
      return OkStatus();
    }
    return Bad(path + ".pattern", "must be an object {\"String\": ...} or {\"Regex\": ...}");
  }

  Result<std::string> Type(const Json& obj, const std::string& path) const {
    if (!obj.is_object()) return Bad(path, "must be an object or null");
    auto it = obj.find("type");
    if (it == obj.end() || !it->is_string()) return Bad(path + ".type", "must be a string");
    return it->get<std::string>();
  }

  // Flattens a component that is null, one object, or {"type":"Sequence",
  // <list_key>: [...]} (nested sequences allowed) into `out` with paths.
  Status Flatten(const Json& obj, const std::string& path, const char* list_key,
                 std::vector<std::pair<const Json*, std::string>>* out, int depth = 0) const {
    if (obj.is_null()) return OkStatus();
    if (depth > 8) return Bad(path, "nests Sequences too deeply");
    ARBITER_ASSIGN_OR_RETURN(std::string type, Type(obj, path));
    if (type != "Sequence") {
      out->push_back({&obj, path});
      return OkStatus();
    }
    auto it = obj.find(list_key);
    if (it == obj.end() || !it->is_array()) {
      return Bad(path + "." + list_key, "must be an array");
    }
    for (size_t i = 0; i < it->size(); ++i) {
      ARBITER_RETURN_IF_ERROR(Flatten((*it)[i], path + "." + list_key + "[" + std::to_string(i) + "]",
                                      list_key, out, depth + 1));
    }
    return OkStatus();
  }

  Status Model(const Json& root, TokenizerJsonSpec* spec) const {
    auto mit = root.find("model");
    if (mit == root.end() || !mit->is_object()) return Bad("model", "must be an object");
    const Json& m = *mit;
    ARBITER_ASSIGN_OR_RETURN(std::string type, Str(m, "type", "model", ""));
    if (type.empty()) {
      // Old files omit the type; HF infers it from the fields present.
      if (m.contains("merges")) type = "BPE";
    }
    if (type != "BPE") {
      return Unsupported("model.type", "is \"" + type +
                                           "\"; only BPE tokenizers are supported "
                                           "(WordPiece/Unigram/WordLevel are not)");
    }
    spec->model_type = type;
    auto vit = m.find("vocab");
    if (vit == m.end() || !vit->is_object()) return Bad("model.vocab", "must be an object");
    spec->vocab.reserve(vit->size());
    std::unordered_set<int64_t> ids;
    std::unordered_set<std::string> tokens;
    for (auto it = vit->begin(); it != vit->end(); ++it) {
      if (!it.value().is_number_integer()) {
        return Bad("model.vocab[\"" + it.key() + "\"]", "must be an integer id");
      }
      int64_t id = it.value().get<int64_t>();
      if (id < 0 || id > kMaxTokenId) {
        return Bad("model.vocab[\"" + it.key() + "\"]",
                   "is out of range: " + std::to_string(id) + " (ids must be in [0, " +
                       std::to_string(kMaxTokenId) + "])");
      }
      if (!ids.insert(id).second) {
        return Bad("model.vocab[\"" + it.key() + "\"]", "reuses id " + std::to_string(id));
      }
      tokens.insert(it.key());
      spec->vocab.emplace_back(it.key(), static_cast<int32_t>(id));
    }
    auto git = m.find("merges");
    if (git != m.end() && !git->is_null()) {
      if (!git->is_array()) return Bad("model.merges", "must be an array");
      spec->merges.reserve(git->size());
      for (size_t i = 0; i < git->size(); ++i) {
        const Json& e = (*git)[i];
        std::string field = "model.merges[" + std::to_string(i) + "]";
        std::pair<std::string, std::string> merge;
        if (e.is_string()) {
          const std::string& s = e.get_ref<const std::string&>();
          size_t sp = s.find(' ');
          if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size() ||
              s.find(' ', sp + 1) != std::string::npos) {
            return Bad(field, "must be a string \"a b\" or a pair");
          }
          merge = {s.substr(0, sp), s.substr(sp + 1)};
        } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
          merge = {e[0].get<std::string>(), e[1].get<std::string>()};
        } else {
          return Bad(field, "must be a string \"a b\" or a pair");
        }
        if (!tokens.count(merge.first)) {
          return Bad(field, "uses \"" + merge.first + "\", which is not in model.vocab");
        }
        if (!tokens.count(merge.second)) {
          return Bad(field, "uses \"" + merge.second + "\", which is not in model.vocab");
        }
        if (!tokens.count(merge.first + merge.second)) {
          return Bad(field, "produces \"" + merge.first + merge.second +
                                "\", which is not in model.vocab");
        }
        spec->merges.push_back(std::move(merge));
      }
    }
    ARBITER_ASSIGN_OR_RETURN(spec->byte_fallback, Bool(m, "byte_fallback", "model", false));
    ARBITER_ASSIGN_OR_RETURN(spec->ignore_merges, Bool(m, "ignore_merges", "model", false));
    ARBITER_ASSIGN_OR_RETURN(spec->fuse_unk, Bool(m, "fuse_unk", "model", false));
    ARBITER_ASSIGN_OR_RETURN(spec->unk_token, Str(m, "unk_token", "model", ""));
    if (!spec->unk_token.empty() && !tokens.count(spec->unk_token)) {
      return Bad("model.unk_token", "\"" + spec->unk_token + "\" is not in model.vocab");
    }
    ARBITER_ASSIGN_OR_RETURN(std::string prefix,
                             Str(m, "continuing_subword_prefix", "model", ""));
    ARBITER_ASSIGN_OR_RETURN(std::string suffix, Str(m, "end_of_word_suffix", "model", ""));
    if (!prefix.empty()) {
      return Unsupported("model.continuing_subword_prefix", "is not supported");
    }
    if (!suffix.empty()) return Unsupported("model.end_of_word_suffix", "is not supported");
    auto dit = m.find("dropout");
    if (dit != m.end() && !dit->is_null()) {
      if (!dit->is_number()) return Bad("model.dropout", "must be a number or null");
      // Dropout is a training-time feature; inference ignores it (HF too
      // when dropout is 0). A non-zero value is accepted and ignored.
    }
    return OkStatus();
  }

  Status AddedTokens(const Json& root, TokenizerJsonSpec* spec) const {
    auto it = root.find("added_tokens");
    if (it == root.end() || it->is_null()) return OkStatus();
    if (!it->is_array()) return Bad("added_tokens", "must be an array");
    for (size_t i = 0; i < it->size(); ++i) {
      const Json& e = (*it)[i];
      std::string path = "added_tokens[" + std::to_string(i) + "]";
      if (!e.is_object()) return Bad(path, "must be an object");
      auto id = e.find("id");
      if (id == e.end() || !id->is_number_integer()) return Bad(path + ".id", "must be an integer");
      int64_t v = id->get<int64_t>();
      if (v < 0 || v > kMaxTokenId) {
        return Bad(path + ".id", "is out of range: " + std::to_string(v) + " (ids must be in [0, " +
                                     std::to_string(kMaxTokenId) + "])");
      }
      TokenizerAddedToken t;
      t.id = static_cast<int32_t>(v);
      ARBITER_ASSIGN_OR_RETURN(t.content, RequiredStr(e, "content", path));
      if (t.content.empty()) return Bad(path + ".content", "must not be empty");
      ARBITER_ASSIGN_OR_RETURN(t.special, Bool(e, "special", path, false));
      ARBITER_ASSIGN_OR_RETURN(t.lstrip, Bool(e, "lstrip", path, false));
      ARBITER_ASSIGN_OR_RETURN(t.rstrip, Bool(e, "rstrip", path, false));
      ARBITER_ASSIGN_OR_RETURN(t.single_word, Bool(e, "single_word", path, false));
      // HF's AddedToken::from(content, special) defaults normalized to !special.
      ARBITER_ASSIGN_OR_RETURN(t.normalized, Bool(e, "normalized", path, !t.special));
      spec->added_tokens.push_back(std::move(t));
    }
    return OkStatus();
  }

  Status Normalizer(const Json& root, TokenizerJsonSpec* spec) const {
    auto it = root.find("normalizer");
    if (it == root.end()) return OkStatus();
    std::vector<std::pair<const Json*, std::string>> steps;
    ARBITER_RETURN_IF_ERROR(Flatten(*it, "normalizer", "normalizers", &steps));
    for (const auto& [obj, path] : steps) {
      ARBITER_ASSIGN_OR_RETURN(std::string type, Type(*obj, path));
      TokenizerNormalizerStep s;
      if (type == "Prepend") {
        s.kind = TokenizerNormalizerStep::Kind::kPrepend;
        ARBITER_ASSIGN_OR_RETURN(s.prepend, RequiredStr(*obj, "prepend", path));
      } else if (type == "Replace") {
        s.kind = TokenizerNormalizerStep::Kind::kReplace;
        ARBITER_RETURN_IF_ERROR(Pattern(*obj, path, &s.pattern, &s.pattern_is_regex));
        ARBITER_ASSIGN_OR_RETURN(s.content, RequiredStr(*obj, "content", path));
        if (s.pattern.empty()) return Bad(path + ".pattern", "must not be empty");
      } else if (type == "NFC") {
        s.kind = TokenizerNormalizerStep::Kind::kNfc;
      } else if (type == "NFD") {
        s.kind = TokenizerNormalizerStep::Kind::kNfd;
      } else if (type == "NFKC") {
        s.kind = TokenizerNormalizerStep::Kind::kNfkc;
      } else if (type == "NFKD") {
        s.kind = TokenizerNormalizerStep::Kind::kNfkd;
      } else if (type == "Lowercase") {
        s.kind = TokenizerNormalizerStep::Kind::kLowercase;
      } else if (type == "StripAccents") {
        s.kind = TokenizerNormalizerStep::Kind::kStripAccents;
      } else if (type == "Strip") {
        s.kind = TokenizerNormalizerStep::Kind::kStrip;
        ARBITER_ASSIGN_OR_RETURN(s.strip_left, Bool(*obj, "strip_left", path, true));
        ARBITER_ASSIGN_OR_RETURN(s.strip_right, Bool(*obj, "strip_right", path, true));
      } else {
        return Unsupported(path + ".type", "is \"" + type +
                                               "\"; supported normalizers: NFC, NFD, NFKC, NFKD, "
                                               "Lowercase, StripAccents, Strip, Replace, Prepend, "
                                               "Sequence");
      }
      spec->normalizer.push_back(std::move(s));
    }
    return OkStatus();
  }

  Result<TokenizerPreTokenizerStep::PrependScheme> Scheme(const Json& obj,
                                                          const std::string& path) const {
    using S = TokenizerPreTokenizerStep::PrependScheme;
    ARBITER_ASSIGN_OR_RETURN(bool add_prefix, Bool(obj, "add_prefix_space", path, true));
    ARBITER_ASSIGN_OR_RETURN(std::string scheme,
                             Str(obj, "prepend_scheme", path, add_prefix ? "always" : "never"));
    if (scheme == "always") return S::kAlways;
    if (scheme == "first") return S::kFirst;
    if (scheme == "never") return S::kNever;
    return Bad(path + ".prepend_scheme", "must be \"always\", \"first\" or \"never\"");
  }

  Status PreTokenizer(const Json& root, TokenizerJsonSpec* spec) const {
    auto it = root.find("pre_tokenizer");
    if (it == root.end()) return OkStatus();
    std::vector<std::pair<const Json*, std::string>> steps;
    ARBITER_RETURN_IF_ERROR(Flatten(*it, "pre_tokenizer", "pretokenizers", &steps));
    for (const auto& [obj, path] : steps) {
      ARBITER_ASSIGN_OR_RETURN(std::string type, Type(*obj, path));
      TokenizerPreTokenizerStep s;
      if (type == "ByteLevel") {
        s.kind = TokenizerPreTokenizerStep::Kind::kByteLevel;
        ARBITER_ASSIGN_OR_RETURN(s.add_prefix_space, Bool(*obj, "add_prefix_space", path, true));
        ARBITER_ASSIGN_OR_RETURN(s.use_regex, Bool(*obj, "use_regex", path, true));
      } else if (type == "Split") {
        s.kind = TokenizerPreTokenizerStep::Kind::kSplit;
        ARBITER_RETURN_IF_ERROR(Pattern(*obj, path, &s.pattern, &s.pattern_is_regex));
        if (s.pattern.empty()) return Bad(path + ".pattern", "must not be empty");
        ARBITER_ASSIGN_OR_RETURN(std::string behavior, RequiredStr(*obj, "behavior", path));
        using B = TokenizerPreTokenizerStep::Behavior;
        if (behavior == "Removed") {
          s.behavior = B::kRemoved;
        } else if (behavior == "Isolated") {
          s.behavior = B::kIsolated;
        } else if (behavior == "MergedWithPrevious") {
          s.behavior = B::kMergedWithPrevious;
        } else if (behavior == "MergedWithNext") {
          s.behavior = B::kMergedWithNext;
        } else if (behavior == "Contiguous") {
          s.behavior = B::kContiguous;
        } else {
          return Bad(path + ".behavior", "is \"" + behavior +
                                             "\"; must be Removed, Isolated, MergedWithPrevious, "
                                             "MergedWithNext or Contiguous");
        }
        ARBITER_ASSIGN_OR_RETURN(s.invert, Bool(*obj, "invert", path, false));
      } else if (type == "Digits") {
        s.kind = TokenizerPreTokenizerStep::Kind::kDigits;
        ARBITER_ASSIGN_OR_RETURN(s.individual_digits,
                                 Bool(*obj, "individual_digits", path, false));
      } else if (type == "Whitespace") {
        s.kind = TokenizerPreTokenizerStep::Kind::kWhitespace;
      } else if (type == "WhitespaceSplit") {
        s.kind = TokenizerPreTokenizerStep::Kind::kWhitespaceSplit;
      } else if (type == "Metaspace") {
        s.kind = TokenizerPreTokenizerStep::Kind::kMetaspace;
        ARBITER_ASSIGN_OR_RETURN(s.replacement, Str(*obj, "replacement", path, "\xE2\x96\x81"));
        if (s.replacement.empty()) return Bad(path + ".replacement", "must not be empty");
        ARBITER_ASSIGN_OR_RETURN(s.prepend_scheme, Scheme(*obj, path));
        ARBITER_ASSIGN_OR_RETURN(s.split, Bool(*obj, "split", path, true));
      } else {
        return Unsupported(path + ".type", "is \"" + type +
                                               "\"; supported pre-tokenizers: ByteLevel, Split, "
                                               "Digits, Metaspace, Whitespace, WhitespaceSplit, "
                                               "Sequence");
      }
      spec->pre_tokenizer.push_back(std::move(s));
    }
    return OkStatus();
  }

  Status Decoder(const Json& root, TokenizerJsonSpec* spec) const {
    auto it = root.find("decoder");
    if (it == root.end()) return OkStatus();
    std::vector<std::pair<const Json*, std::string>> steps;
    ARBITER_RETURN_IF_ERROR(Flatten(*it, "decoder", "decoders", &steps));
    for (const auto& [obj, path] : steps) {
      ARBITER_ASSIGN_OR_RETURN(std::string type, Type(*obj, path));
      TokenizerDecoderStep s;
      if (type == "ByteLevel") {
        s.kind = TokenizerDecoderStep::Kind::kByteLevel;
      } else if (type == "Replace") {
        s.kind = TokenizerDecoderStep::Kind::kReplace;
        ARBITER_RETURN_IF_ERROR(Pattern(*obj, path, &s.pattern, &s.pattern_is_regex));
        if (s.pattern.empty()) return Bad(path + ".pattern", "must not be empty");
        ARBITER_ASSIGN_OR_RETURN(s.content, RequiredStr(*obj, "content", path));
      } else if (type == "ByteFallback") {
        s.kind = TokenizerDecoderStep::Kind::kByteFallback;
      } else if (type == "Fuse") {
        s.kind = TokenizerDecoderStep::Kind::kFuse;
      } else if (type == "Strip") {
        s.kind = TokenizerDecoderStep::Kind::kStrip;
        ARBITER_ASSIGN_OR_RETURN(s.content, RequiredStr(*obj, "content", path));
        ARBITER_ASSIGN_OR_RETURN(s.strip_start, Int(*obj, "start", path, 0));
        ARBITER_ASSIGN_OR_RETURN(s.strip_stop, Int(*obj, "stop", path, 0));
      } else if (type == "Metaspace") {
        s.kind = TokenizerDecoderStep::Kind::kMetaspace;
        ARBITER_ASSIGN_OR_RETURN(s.replacement, Str(*obj, "replacement", path, "\xE2\x96\x81"));
        ARBITER_ASSIGN_OR_RETURN(auto scheme, Scheme(*obj, path));
        s.add_prefix_space = scheme != TokenizerPreTokenizerStep::PrependScheme::kNever;
      } else {
        return Unsupported(path + ".type", "is \"" + type +
                                               "\"; supported decoders: ByteLevel, Replace, "
                                               "ByteFallback, Fuse, Strip, Metaspace, Sequence");
      }
      spec->decoder.push_back(std::move(s));
    }
    return OkStatus();
  }

 private:
  const std::string& name_;
};

}  // namespace

Result<TokenizerJsonSpec> ParseTokenizerJson(std::string_view json_text, const std::string& name) {
  Json root;
  try {
    root = Json::parse(json_text.begin(), json_text.end());
  } catch (const std::exception& e) {
    return DataLossError(name + ": not valid JSON (" + e.what() + ")");
  }
  Parser p(name);
  if (!root.is_object()) return DataLossError(name + ": top level must be a JSON object");
  TokenizerJsonSpec spec;
  ARBITER_RETURN_IF_ERROR(p.Model(root, &spec));
  ARBITER_RETURN_IF_ERROR(p.AddedTokens(root, &spec));
  ARBITER_RETURN_IF_ERROR(p.Normalizer(root, &spec));
  ARBITER_RETURN_IF_ERROR(p.PreTokenizer(root, &spec));
  ARBITER_RETURN_IF_ERROR(p.Decoder(root, &spec));
  return spec;
}

Result<TokenizerJsonSpec> LoadTokenizerJson(const std::string& path) {
  ARBITER_ASSIGN_OR_RETURN(std::string text, ReadFile(path, size_t{1} << 30));
  return ParseTokenizerJson(text, path);
}

Result<std::string> ParseChatTemplateField(std::string_view tokenizer_config_json,
                                           const std::string& name) {
  Json j = Json::parse(tokenizer_config_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return DataLossError(name + ": not a JSON object");
  }
  auto it = j.find("chat_template");
  if (it == j.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    const Json* chosen = nullptr;
    for (const Json& t : *it) {
      if (!t.is_object() || !t.contains("template") || !t["template"].is_string()) {
        return DataLossError(name + ": field \"chat_template\" must be a string or a list of "
                                    "{\"name\", \"template\"} objects");
      }
      if (chosen == nullptr) chosen = &t;
      if (t.contains("name") && t["name"] == "default") chosen = &t;
    }
    return chosen == nullptr ? std::string() : (*chosen)["template"].get<std::string>();
  }
  return DataLossError(name + ": field \"chat_template\" must be a string or a list of "
                              "{\"name\", \"template\"} objects");
}

}  // namespace arbiter
