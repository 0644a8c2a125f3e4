# Tokenizer side of the engine layer (paths relative to src/engine):
# tokenizer, chat templates, BPE trainer, make-model.
set(ENGINE_TOKENIZER_SOURCES
  tokenizer.cc
  chat_template.cc
  bpe_trainer.cc
  model_maker.cc
  internal/pcre2_regex.cc)
set(ENGINE_TOKENIZER_TESTS
  tokenizer_test.cc
  chat_template_test.cc
  bpe_trainer_test.cc
  model_maker_test.cc)
