/* llama.cpp's CPU logits for a golden (tests/data/reference/<case>.txt, the format of
 * llama_reference.py): the prompt's teacher-forced logits at every position in one batch, then
 * `greedy` argmax tokens decoded one at a time (KV f32, flash attention off, 1 sequence).
 * Built and run by make_llama_cpp_goldens.sh against a llama.cpp build (libllama).
 *   llama_cpp_logits MODEL.gguf 1,45,300 8 OUT.txt */
#include <ggml.h>
#include <llama.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void quiet(enum ggml_log_level level, const char* text, void* user) {
  (void)user;
  if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static uint64_t fnv1a64(const char* path) {
  FILE* f = fopen(path, "rb");
  if (!f) return 0;
  uint64_t h = 0xCBF29CE484222325ull;
  static unsigned char buffer[1 << 16];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, f)) > 0)
    for (size_t i = 0; i < n; ++i) h = (h ^ buffer[i]) * 0x100000001B3ull;
  fclose(f);
  return h;
}

static int argmax(const float* v, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (v[i] > v[best]) best = i;
  return best;
}

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s MODEL TOKENS(comma-separated) GREEDY OUT\n", argv[0]);
    return 2;
  }
  const char* model_path = argv[1];
  int tokens[512];
  int n_tokens = 0;
  for (char* s = strtok(argv[2], ","); s && n_tokens < 512; s = strtok(NULL, ","))
    tokens[n_tokens++] = atoi(s);
  const int n_greedy = atoi(argv[3]);

  llama_log_set(quiet, NULL);
  llama_backend_init();
  struct llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  struct llama_model* model = llama_model_load_from_file(model_path, mp);
  if (!model) {
    fprintf(stderr, "cannot load %s\n", model_path);
    return 1;
  }
  struct llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 256;
  cp.n_batch = 256;
  cp.n_ubatch = 256;
  cp.n_seq_max = 1;
  cp.n_threads = cp.n_threads_batch = 2;
  cp.type_k = GGML_TYPE_F32;
  cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.no_perf = true;
  struct llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) {
    fprintf(stderr, "cannot make a context\n");
    return 1;
  }
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

  struct llama_batch batch = llama_batch_init(512, 0, 1);
  for (int i = 0; i < n_tokens; ++i) {
    batch.token[i] = tokens[i];
    batch.pos[i] = i;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = 1;
  }
  batch.n_tokens = n_tokens;
  if (llama_decode(ctx, batch) != 0) {
    fprintf(stderr, "llama_decode failed on the prompt\n");
    return 1;
  }
  float* logits = malloc(sizeof(float) * (size_t)n_tokens * (size_t)n_vocab);
  for (int i = 0; i < n_tokens; ++i)
    memcpy(logits + (size_t)i * n_vocab, llama_get_logits_ith(ctx, i), sizeof(float) * n_vocab);

  int greedy[512];
  int next = argmax(logits + (size_t)(n_tokens - 1) * n_vocab, n_vocab);
  for (int g = 0; g < n_greedy; ++g) {
    greedy[g] = next;
    batch.token[0] = next;
    batch.pos[0] = n_tokens + g;
    batch.n_seq_id[0] = 1;
    batch.seq_id[0][0] = 0;
    batch.logits[0] = 1;
    batch.n_tokens = 1;
    if (llama_decode(ctx, batch) != 0) {
      fprintf(stderr, "llama_decode failed on greedy token %d\n", g);
      return 1;
    }
    next = argmax(llama_get_logits_ith(ctx, 0), n_vocab);
  }

  FILE* out = fopen(argv[4], "w");
  if (!out) {
    fprintf(stderr, "cannot write %s\n", argv[4]);
    return 1;
  }
  const char* base = strrchr(model_path, '/');
  fprintf(out, "# llama.cpp CPU (llama_cpp_logits.c) %s\n", base ? base + 1 : model_path);
  fprintf(out, "model_fnv1a64 %016llx\n", (unsigned long long)fnv1a64(model_path));
  fprintf(out, "tokens");
  for (int i = 0; i < n_tokens; ++i) fprintf(out, " %d", tokens[i]);
  fprintf(out, "\ngreedy");
  for (int g = 0; g < n_greedy; ++g) fprintf(out, " %d", greedy[g]);
  fprintf(out, "\nlogits %d %d\n", n_tokens, n_vocab);
  for (int i = 0; i < n_tokens; ++i) {
    for (int v = 0; v < n_vocab; ++v)
      fprintf(out, v ? " %.9g" : "%.9g", logits[(size_t)i * n_vocab + v]);
    fprintf(out, "\n");
  }
  fclose(out);
  free(logits);
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
