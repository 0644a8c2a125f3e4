// arbiter/formats/gguf_tokenizer.h — the tokenizer stored in a GGUF file's
// metadata, as the spec the engine's Tokenizer is built from
// (Tokenizer::FromSpec).
//
// Keys read (llama.cpp's converter writes them):
//   tokenizer.ggml.model        "gpt2": byte-level BPE with merges;
//                               "llama": SentencePiece BPE with scores
//   tokenizer.ggml.tokens       [string] the vocabulary, id = index
//   tokenizer.ggml.token_type   [int] per token: 1 normal, 2 unknown,
//                               3 control, 4 user-defined, 5 unused, 6 byte
//                               (absent: every token normal)
//   gpt2:  tokenizer.ggml.merges [string] "a b", in rank order
//          tokenizer.ggml.pre   the pre-tokenizer (absent = "default"):
//                               "default" (llama.cpp's four splits), "gpt2" /
//                               "gpt-2" (the GPT-2 regex), "qwen2" (Qwen's
//                               split regex, plus the NFC normalizer of
//                               Qwen's tokenizer.json, which llama.cpp skips),
//                               "llama-bpe" / "llama3" / "llama-v3" (Llama 3's
//                               regex, ignore_merges), "deepseek-v3"
//                               (DeepSeek V3's three splits)
//   llama: tokenizer.ggml.scores [float] per token (absent: all 0)
//          tokenizer.ggml.add_space_prefix (absent: true)
//          tokenizer.ggml.unknown_token_id (absent: 0)
// Unknown (2), control (3) and user-defined (4) tokens become added tokens
// matched in the raw text before anything else (special for 2 and 3). The
// gpt2 pipeline is tokenizer.json's for these models: the Split regexes
// (Isolated) then ByteLevel (no prefix space, no regex); decoder ByteLevel.
// The llama pipeline is HF's Llama 2 one: normalizer Prepend("▁") when
// add_space_prefix, Replace(" " → "▁"); BPE with byte fallback, merging by
// score (TokenizerJsonSpec::scores; every token, added ones too, is in the
// vocab); decoder Replace("▁" → " "), ByteFallback, Fuse, Strip(1 leading
// space) when add_space_prefix.
//
// Errors: kDataLoss naming the file and key for a missing or mistyped key
// or a token_type / scores array of another length; kUnimplemented naming
// the key and value for another tokenizer.ggml.model ("bert", "t5", …) or an
// unknown tokenizer.ggml.pre.
//
// Thread safety: pure function.
#pragma once

#include "arbiter/base/status.h"
#include "arbiter/formats/gguf.h"
#include "arbiter/formats/tokenizer_json.h"

namespace arbiter {

Result<TokenizerJsonSpec> TokenizerSpecFromGguf(const GgufFile& gguf);

}  // namespace arbiter
