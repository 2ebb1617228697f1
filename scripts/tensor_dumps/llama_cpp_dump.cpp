// Dumps named f32 tensors (full precision) from a llama.cpp forward pass, as
// /tmp/lcpp_NAME-LAYER.bin (see README.md here). Build against the llama.cpp that
// scripts/build_llama_cpp.sh builds:
//   src=$(scripts/build_llama_cpp.sh)
//   g++ -O2 -std=c++17 scripts/tensor_dumps/llama_cpp_dump.cpp -I"$src/include" -I"$src/ggml/include" \
//     -L"$src/build/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$src/build/bin" -o .bench/llama_cpp_dump
// Usage: llama_cpp_dump MODEL.gguf FLASH_ATTN(0/1) TOKEN,TOKEN,... [NAME_FILTER] [seq]
#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
static const char * want_prefix = nullptr;
static bool cb(struct ggml_tensor * t, bool ask, void *) {
    if (ask) return true;  // want every tensor's data
    if (t->type != GGML_TYPE_F32) return true;
    std::string name = t->name;
    if (want_prefix && name.rfind(want_prefix, 0) != 0 && name.find(want_prefix) == std::string::npos) return true;
    size_t n = ggml_nelements(t);
    std::vector<float> buf(n);
    ggml_backend_tensor_get(t, buf.data(), 0, n * sizeof(float));
    std::string fn = "/tmp/lcpp_" + name + ".bin";
    for (auto & c : fn) if (c == ' ' || c == '(' || c == ')') c = '_';
    FILE * f = fopen(fn.c_str(), "wb"); fwrite(buf.data(), 4, n, f); fclose(f);
    return true;
}
int main(int argc, char ** argv) {
    // usage: dump MODEL fa(0/1) tok,tok,... [name-filter]
    if (argc > 4) want_prefix = argv[4];
    llama_backend_init();
    auto mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    auto cp = llama_context_default_params();
    cp.n_ctx = 512; cp.n_batch = 512; cp.n_threads = 1; cp.n_threads_batch = 1;
    cp.flash_attn_type = atoi(argv[2]) ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.cb_eval = cb; cp.cb_eval_user_data = nullptr;
    llama_context * ctx = llama_init_from_model(model, cp);
    std::vector<llama_token> toks;
    for (char * p = strtok(argv[3], ","); p; p = strtok(nullptr, ",")) toks.push_back(atoi(p));
    bool seq = argc > 5 && std::string(argv[5]) == "seq";
    if (seq) {
        for (size_t i = 0; i < toks.size(); i++) { llama_batch b = llama_batch_get_one(&toks[i], 1); if (llama_decode(ctx, b)) return 1; }
    } else {
        llama_batch b = llama_batch_get_one(toks.data(), toks.size());
        if (llama_decode(ctx, b)) { fprintf(stderr, "decode failed\n"); return 1; }
    }
    float * logits = llama_get_logits_ith(ctx, -1);
    int nv = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE * f = fopen("/tmp/lcpp_logits.bin", "wb"); fwrite(logits, 4, nv, f); fclose(f);
    return 0;
}
