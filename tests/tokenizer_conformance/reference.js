// Reference ids for the tokenizer conformance test (tokenizer_conformance_test.cc).
//
// Usage: node reference.js <deps dir holding node_modules> <corpus.json> <out.json> [name...]
// Writes {"<name>": {"ids": [[...], ...], "decoded": ["...", ...]}, ...}: for
// every corpus string, the ids of @lenml/tokenizers (a JavaScript port of
// Hugging Face tokenizers) with HF's defaults — special tokens written in the
// text are parsed — but no BOS/EOS added (arbiter's Encode adds none), and
// the decoding of those ids with special tokens kept.
'use strict';
const fs = require('fs');
const path = require('path');
const { createRequire } = require('module');

const [depsDir, corpusPath, outPath, ...only] = process.argv.slice(2);
const requireDeps = createRequire(path.join(path.resolve(depsDir), 'package.json'));
const corpus = JSON.parse(fs.readFileSync(corpusPath, 'utf8'));
const all = ['qwen3', 'llama3', 'llama2', 'gemma3', 'deepseek_v3'];
const names = only.length ? only : all;
const out = {};
for (const name of names) {
  const tok = requireDeps(`@lenml/tokenizer-${name}`).fromPreTrained();
  const ids = corpus.map((s) => Array.from(tok.encode(s, { add_special_tokens: false })));
  const decoded = ids.map((x) =>
    tok.decode(x, { skip_special_tokens: false, clean_up_tokenization_spaces: false }));
  out[name] = { ids, decoded };
}
fs.writeFileSync(outPath, JSON.stringify(out));
