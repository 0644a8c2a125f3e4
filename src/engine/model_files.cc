// engine/model_files.cc — OpenModelFiles (arbiter/engine/model_files.h).
#include "arbiter/engine/model_files.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>

#include "arbiter/base/file.h"
#include "arbiter/base/hash.h"
#include "arbiter/formats/gguf.h"
#include "arbiter/formats/gguf_tokenizer.h"
#include "arbiter/formats/safetensors.h"
#include "engine/internal/model_files_internal.h"
#include "engine/internal/model_weights.h"

namespace arbiter {

ModelFiles::~ModelFiles() = default;

const ModelConfig& ModelFiles::config() const { return layout_->config; }

const std::vector<WeightSpec>& ModelFiles::weight_specs() const { return layout_->buffers; }

size_t ModelFiles::weight_bytes() const { return layout_->bytes(); }

Result<ChatTemplateKind> ModelFiles::chat_template() const {
  if (chat_template_) return *chat_template_;
  return chat_template_error_;
}

uint64_t ModelFiles::WeightsDigestFor(std::string_view key) const {
  return WeightsDigest(key, layout_->buffers, files_token_);
}

Result<std::shared_ptr<const ModelFiles>> OpenModelFiles(const std::string& model_dir,
                                                         const ModelFilesOptions& options) {
  return engine_internal::ModelFilesAccess::Open(model_dir, /*with_tokenizer=*/true, options);
}

namespace engine_internal {

uint64_t FilesToken(const std::vector<std::string>& paths) {
  std::string bytes;
  for (const std::string& f : paths) {
    const uint64_t t = WeightsFileToken(f);
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((t >> (8 * i)) & 0xff));
  }
  const uint64_t h = Xxh3_64(bytes.data(), bytes.size());
  return h == 0 ? 1 : h;
}

namespace {

// Chooses the chat format of `files` (its tokenizer set) from the override
// or `template_text`; an error only when one of them is given and fails.
Status ChooseTemplate(const Tokenizer& tokenizer,
                      const std::string& template_text, const ModelFilesOptions& options,
                      const std::string& model, std::optional<ChatTemplateKind>* kind,
                      Status* error) {
  Result<ChatTemplateKind> chosen =
      ChooseChatTemplate(tokenizer, template_text, options.chat_template);
  if (chosen.ok()) {
    *kind = *chosen;
    return OkStatus();
  }
  if (options.chat_template || !template_text.empty()) return chosen.status().WithPrefix(model);
  *error = chosen.status();  // no chat format: a completions-only model
  return OkStatus();
}

// A GGUF file: a regular file whose first four bytes are "GGUF".
bool IsGgufFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

}  // namespace

Result<std::shared_ptr<const ModelFiles>> ModelFilesAccess::Open(const std::string& model_dir,
                                                                 bool with_tokenizer,
                                                                 const ModelFilesOptions& options) {
  const ComputeOptions compute{.f32 = options.compute_f32};
  try {
    std::shared_ptr<ModelFiles> files(new ModelFiles());
    files->dir_ = model_dir;
    if (IsGgufFile(model_dir)) {
      // One file holds the config, the tokenizer and the tensors.
      ARBITER_ASSIGN_OR_RETURN(GgufFile gguf, OpenGguf(model_dir));
      ARBITER_ASSIGN_OR_RETURN(ModelConfig config, ModelConfigFromGguf(gguf));
      if (with_tokenizer) {
        ARBITER_ASSIGN_OR_RETURN(TokenizerJsonSpec spec, TokenizerSpecFromGguf(gguf));
        ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer,
                                 Tokenizer::FromSpec(std::move(spec), model_dir));
        std::string template_text;
        if (gguf.FindValue("tokenizer.chat_template") != nullptr) {
          ARBITER_ASSIGN_OR_RETURN(template_text, gguf.GetString("tokenizer.chat_template"));
        }
        ARBITER_RETURN_IF_ERROR(ChooseTemplate(*tokenizer, template_text, options,
                                               model_dir, &files->chat_template_,
                                               &files->chat_template_error_));
        files->tokenizer_ = std::move(tokenizer);
      }
      ARBITER_ASSIGN_OR_RETURN(ComputeLayout layout,
                               PlanComputeLayoutGguf(config, gguf, model_dir, compute));
      files->layout_ = std::make_shared<const ComputeLayout>(std::move(layout));
      files->weight_files_ = {model_dir};
      files->files_token_ = FilesToken(files->weight_files_);
      return std::shared_ptr<const ModelFiles>(std::move(files));
    }
    const std::string dir =
        model_dir.empty() || model_dir.back() == '/' ? model_dir : model_dir + "/";
    ARBITER_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir + "config.json"));
    if (with_tokenizer) {
      ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer,
                               Tokenizer::Load(dir + "tokenizer.json"));
      std::string template_text;
      Result<std::string> config_text = ReadFile(dir + "tokenizer_config.json");
      if (config_text.ok()) {
        ARBITER_ASSIGN_OR_RETURN(
            template_text, ParseChatTemplateField(*config_text, dir + "tokenizer_config.json"));
      } else if (config_text.status().code() != StatusCode::kNotFound) {
        return config_text.status();
      }
      ARBITER_RETURN_IF_ERROR(ChooseTemplate(*tokenizer, template_text, options,
                                             model_dir, &files->chat_template_,
                                             &files->chat_template_error_));
      files->tokenizer_ = std::move(tokenizer);
    }
    ARBITER_ASSIGN_OR_RETURN(SafetensorsModel st, SafetensorsModel::Open(model_dir));
    ARBITER_ASSIGN_OR_RETURN(ComputeLayout layout,
                             PlanComputeLayout(config, st, model_dir, compute));
    files->layout_ = std::make_shared<const ComputeLayout>(std::move(layout));
    files->weight_files_ = st.files();
    files->files_token_ = FilesToken(st.files());
    return std::shared_ptr<const ModelFiles>(std::move(files));
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(model_dir + ": out of memory reading the model's headers");
  }
}

}  // namespace engine_internal
}  // namespace arbiter
