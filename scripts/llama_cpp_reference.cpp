// llama.cpp's reference outputs for a GGUF in the golden format (see ../shared/golden/README.md,
// without logsumexp and text): for each line "np tok..." of argv[2], the prompt as one batch,
// then argv[3] greedy tokens fed one at a time, with the top-8 logits at every position.
// Built and run by formats_vs_llama_cpp.sh.
#include "llama.h"
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

static std::string top8(const float * l, int nv) {
    std::vector<int> idx(nv);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + 8, idx.end(), [&](int a, int b) { return l[a] > l[b]; });
    std::string s = "{\"top\":[";
    char buf[64];
    for (int i = 0; i < 8; i++) {
        snprintf(buf, sizeof buf, "%s[%d,%.6f]", i ? "," : "", idx[i], l[idx[i]]);
        s += buf;
    }
    return s + "]}";
}

int main(int argc, char ** argv) {
    if (argc < 4) { fprintf(stderr, "usage: %s MODEL.gguf PROMPTS N_GREEDY\n", argv[0]); return 2; }
    llama_backend_init();
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    int nv = llama_vocab_n_tokens(vocab);
    int n_greedy = atoi(argv[3]);
    std::ifstream in(argv[2]);
    std::string line;
    while (std::getline(in, line)) {
        std::istringstream ss(line);
        int np; ss >> np;
        std::vector<llama_token> toks(np);
        for (auto & t : toks) ss >> t;
        auto cp = llama_context_default_params();
        cp.n_ctx = 512; cp.n_batch = 512; cp.n_threads = 2; cp.n_threads_batch = 2;
        llama_context * ctx = llama_init_from_model(model, cp);
        std::string prompt_logits, greedy_steps, greedy_tokens, tokens;
        llama_batch b = llama_batch_init(np, 0, 1);
        for (int i = 0; i < np; i++) {
            b.token[i] = toks[i]; b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = 1;
            tokens += (i ? "," : "") + std::to_string(toks[i]);
        }
        b.n_tokens = np;
        if (llama_decode(ctx, b)) { fprintf(stderr, "decode failed\n"); return 1; }
        for (int i = 0; i < np; i++) prompt_logits += (i ? "," : "") + top8(llama_get_logits_ith(ctx, i), nv);
        llama_batch_free(b);
        const float * last = llama_get_logits_ith(ctx, np - 1);
        for (int j = 0; j < n_greedy; j++) {
            llama_token t = std::max_element(last, last + nv) - last;
            greedy_tokens += (j ? "," : "") + std::to_string(t);
            if (llama_vocab_is_eog(vocab, t)) break;
            llama_batch one = llama_batch_init(1, 0, 1);
            one.token[0] = t; one.pos[0] = np + j; one.n_seq_id[0] = 1; one.seq_id[0][0] = 0; one.logits[0] = 1;
            one.n_tokens = 1;
            if (llama_decode(ctx, one)) { fprintf(stderr, "decode failed\n"); return 1; }
            llama_batch_free(one);
            last = llama_get_logits_ith(ctx, 0);
            greedy_steps += (j ? "," : "") + top8(last, nv);
        }
        printf("{\"tokens\":[%s],\"prompt_logits\":[%s],\"greedy_tokens\":[%s],\"greedy_steps\":[%s]}\n",
               tokens.c_str(), prompt_logits.c_str(), greedy_tokens.c_str(), greedy_steps.c_str());
        llama_free(ctx);
    }
    llama_model_free(model);
    return 0;
}
