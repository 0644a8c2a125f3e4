#include "engine/internal/test_model.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>

#include "arbiter/base/file.h"

namespace arbiter::engine_internal {

namespace {

// Directories made by MakeTempDir, removed when the test binary exits.
class TempDirs {
 public:
  ~TempDirs() {
    for (const std::string& d : dirs_) {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  }
  void Add(std::string d) {
    std::lock_guard<std::mutex> l(mu_);
    dirs_.push_back(std::move(d));
  }

 private:
  std::mutex mu_;
  std::vector<std::string> dirs_;
};
TempDirs g_temp_dirs;

}  // namespace

Result<TestWeights> LoadTestWeights(const std::string& dir) {
  ARBITER_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir + "/config.json"));
  ARBITER_ASSIGN_OR_RETURN(SafetensorsModel st, SafetensorsModel::Open(dir));
  TestWeights t;
  ARBITER_ASSIGN_OR_RETURN(t.layout, PlanComputeLayout(config, st, dir));
  std::vector<void*> arrays;
  std::vector<const void*> views;
  for (size_t i = 0; i < t.layout.buffers.size(); ++i) {
    t.buffers.emplace_back((t.layout.buffer_bytes(i) + sizeof(float) - 1) / sizeof(float));
    arrays.push_back(t.buffers.back().data());
    views.push_back(t.buffers.back().data());
  }
  ARBITER_RETURN_IF_ERROR(FillComputeLayout(t.layout, st, dir, arrays));
  t.w = BindModelWeights(t.layout, views);
  return t;
}

std::string MakeTempDir(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/" + prefix + "XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) return "";
  g_temp_dirs.Add(buf.data());
  return std::string(buf.data());
}

Result<std::vector<std::vector<double>>> RunReferenceLogitsBatch(
    const std::string& model, const std::vector<std::vector<int32_t>>& prompts, int vocab) {
  const char* python = "/usr/bin/python3";
  if (access(python, X_OK) != 0) {
    return FailedPreconditionError(std::string(python) +
                                   " not found: install python3 and python3-numpy");
  }
  const std::string script = std::string(ARBITER_SOURCE_DIR) + "/scripts/reference_logits.py";
  const std::string out_dir = MakeTempDir("arbiter_ref_");
  const std::string out = out_dir + "/logits.f64";
  std::string args;
  size_t n_tokens = 0;
  for (const std::vector<int32_t>& ids : prompts) {
    // appends: GCC 12 -Wrestrict misfires on "," + std::string&&
    args.append(" --ids ");
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) args.push_back(',');
      args.append(std::to_string(ids[i]));
    }
    n_tokens += ids.size();
  }
  const std::string cmd = std::string(python) + " '" + script + "' '" + model + "'" + args +
                          " --out '" + out + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return InternalError("popen failed for: " + cmd);
  std::string output;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) output.append(buf, n);
  const int rc = pclose(p);
  const int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  if (code == 3) {
    return FailedPreconditionError("numpy is missing for /usr/bin/python3; install "
                                   "python3-numpy (apt-get install python3-numpy). Script said: " +
                                   output);
  }
  if (code != 0) {
    return InternalError("reference script failed (exit " + std::to_string(code) + "): " + cmd +
                         "\n" + output);
  }
  Result<std::string> bytes = ReadFile(out);
  if (!bytes.ok()) return bytes.status();
  const size_t want = n_tokens * static_cast<size_t>(vocab) * sizeof(double);
  if (bytes->size() != want) {
    return InternalError("reference output has " + std::to_string(bytes->size()) +
                         " bytes, expected " + std::to_string(want));
  }
  std::vector<std::vector<double>> logits;
  size_t at = 0;
  for (const std::vector<int32_t>& ids : prompts) {
    std::vector<double> rows(ids.size() * static_cast<size_t>(vocab));
    std::memcpy(rows.data(), bytes->data() + at, rows.size() * sizeof(double));
    at += rows.size() * sizeof(double);
    logits.push_back(std::move(rows));
  }
  return logits;
}

Result<std::vector<double>> RunReferenceLogits(const std::string& model_dir,
                                               const std::vector<int32_t>& ids, int vocab) {
  ARBITER_ASSIGN_OR_RETURN(std::vector<std::vector<double>> logits,
                           RunReferenceLogitsBatch(model_dir, {ids}, vocab));
  return std::move(logits[0]);
}

double MaxRelativeError(const float* got, const double* want, size_t n) {
  double max_err = 0, max_ref = 0;
  for (size_t i = 0; i < n; ++i) {
    max_err = std::max(max_err, std::fabs(static_cast<double>(got[i]) - want[i]));
    max_ref = std::max(max_ref, std::fabs(want[i]));
  }
  return max_ref > 0 ? max_err / max_ref : max_err;
}

double MaxRangeRelativeError(const float* got, const double* want, size_t n) {
  if (n == 0) return 0;
  double max_err = 0, lo = want[0], hi = want[0];
  for (size_t i = 0; i < n; ++i) {
    max_err = std::max(max_err, std::fabs(static_cast<double>(got[i]) - want[i]));
    lo = std::min(lo, want[i]);
    hi = std::max(hi, want[i]);
  }
  return hi > lo ? max_err / (hi - lo) : max_err;
}

Status WriteTestModel(const std::string& dir, const TestModelSpec& s) {
  const bool qwen2 = s.architecture.rfind("Qwen2", 0) == 0;
  const bool qwen3 = s.architecture.rfind("Qwen3", 0) == 0;
  const int64_t H = s.hidden, I = s.inter, V = s.vocab, HD = s.head_dim,
                Q = int64_t{s.n_heads} * HD, KV = int64_t{s.n_kv_heads} * HD;
  std::vector<std::pair<std::string, std::vector<int64_t>>> list;
  list.push_back({"model.embed_tokens.weight", {V, H}});
  for (int i = 0; i < s.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    list.push_back({p + "input_layernorm.weight", {H}});
    list.push_back({p + "self_attn.q_proj.weight", {Q, H}});
    list.push_back({p + "self_attn.k_proj.weight", {KV, H}});
    list.push_back({p + "self_attn.v_proj.weight", {KV, H}});
    if (qwen2) {
      list.push_back({p + "self_attn.q_proj.bias", {Q}});
      list.push_back({p + "self_attn.k_proj.bias", {KV}});
      list.push_back({p + "self_attn.v_proj.bias", {KV}});
    }
    if (qwen3) {
      list.push_back({p + "self_attn.q_norm.weight", {HD}});
      list.push_back({p + "self_attn.k_norm.weight", {HD}});
    }
    list.push_back({p + "self_attn.o_proj.weight", {H, Q}});
    list.push_back({p + "post_attention_layernorm.weight", {H}});
    list.push_back({p + "mlp.gate_proj.weight", {I, H}});
    list.push_back({p + "mlp.up_proj.weight", {I, H}});
    list.push_back({p + "mlp.down_proj.weight", {H, I}});
  }
  list.push_back({"model.norm.weight", {H}});
  if (!s.tied) list.push_back({"lm_head.weight", {V, H}});
  if (s.edit) s.edit(list);

  std::mt19937_64 rng(s.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::string> blobs;
  std::vector<TensorToWrite> tensors;
  for (const auto& [name, shape] : list) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const bool is_norm = name.find("norm") != std::string::npos;
    const bool is_bias = name.find(".bias") != std::string::npos;
    const float fan_in = shape.size() == 2 ? static_cast<float>(shape[1]) : 1.0f;
    std::vector<float> v(n);
    for (float& x : v) {
      if (is_norm) x = 1.0f + 0.2f * normal(rng);
      else if (is_bias) x = 0.1f * normal(rng);
      else if (name.find("embed") != std::string::npos) x = normal(rng);
      else x = normal(rng) / std::sqrt(fan_in);
    }
    std::string blob;
    if (s.dtype == DType::kBF16) {
      blob.resize(n * 2);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h = F32ToBF16(v[i]);
        std::memcpy(&blob[i * 2], &h, 2);
      }
    } else {
      blob.assign(reinterpret_cast<const char*>(v.data()), n * 4);
    }
    blobs.push_back(std::move(blob));
    tensors.push_back(TensorToWrite{name, s.dtype, shape, {}});
  }
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].data = blobs[i];
  ARBITER_RETURN_IF_ERROR(WriteSafetensors(dir + "/model.safetensors", tensors));

  char buf[2048];
  std::snprintf(buf, sizeof(buf),
                "{\"architectures\": [\"%s\"], \"hidden_size\": %d, \"intermediate_size\": %d,"
                " \"num_hidden_layers\": %d, \"num_attention_heads\": %d,"
                " \"num_key_value_heads\": %d, \"head_dim\": %d, \"vocab_size\": %d,"
                " \"rms_norm_eps\": %g, \"rope_theta\": %g, \"max_position_embeddings\": %d,"
                " \"tie_word_embeddings\": %s, \"bos_token_id\": 1, \"eos_token_id\": 2,"
                " \"torch_dtype\": \"%s\"",
                s.architecture.c_str(), s.hidden, s.inter, s.n_layers, s.n_heads, s.n_kv_heads,
                s.head_dim, s.vocab, s.rms_norm_eps, s.rope_theta, s.max_position_embeddings,
                s.tied ? "true" : "false", s.dtype == DType::kBF16 ? "bfloat16" : "float32");
  std::string config = buf;
  if (!s.rope_scaling_json.empty()) config += ", \"rope_scaling\": " + s.rope_scaling_json;
  config += "}\n";
  return WriteFileAtomic(dir + "/config.json", config);
}

}  // namespace arbiter::engine_internal
