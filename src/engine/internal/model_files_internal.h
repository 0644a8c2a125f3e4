// engine/internal/model_files_internal.h — the engine's access to a
// ModelFiles' plan (arbiter/engine/model_files.h keeps it private).
//
// Thread safety: as ModelFiles (immutable).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/engine/model_files.h"
#include "arbiter/engine/tokenizer.h"
#include "engine/internal/model_weights.h"

namespace arbiter::engine_internal {

struct ModelFilesAccess {
  static const std::shared_ptr<const ComputeLayout>& layout(const ModelFiles& f) {
    return f.layout_;
  }
  static const std::shared_ptr<const Tokenizer>& tokenizer(const ModelFiles& f) {
    return f.tokenizer_;
  }
  // OpenModelFiles; without reading tokenizer.json when !with_tokenizer
  // (then tokenizer() must not be called).
  static Result<std::shared_ptr<const ModelFiles>> Open(const std::string& model_dir,
                                                        bool with_tokenizer,
                                                        const ModelFilesOptions& options = {});
};

// XXH3-64 over WeightsFileToken of every path (8 bytes little-endian each,
// in order); never 0. ModelFiles::files_token() of those files now.
uint64_t FilesToken(const std::vector<std::string>& paths);

}  // namespace arbiter::engine_internal
