// llama.cpp against its own golden file (../shared/golden/*.jsonl) under different batching, on
// this CPU: the largest top-8 logit difference, top-1 flips where the margin is >= 0.1, and
// where a free greedy run parts from the golden tokens. Built and run by llama_cpp_selfcheck.sh.
// mode: 0 = prompt as one batch, then greedy tokens one at a time (how the golden files were
// made); 1 = everything one token at a time; 2 = everything in one batch.
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <string>
#include <vector>
#include <fstream>
#include <sstream>
int main(int argc, char ** argv) {
    llama_backend_init();
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    auto mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    int mode = atoi(argv[3]);
    int nv = llama_vocab_n_tokens(llama_model_get_vocab(model));
    // argv[2]: file with lines "ntok_prompt tok... | id logit id logit ... (8 pairs per position) ;"
    std::ifstream in(argv[2]); std::string line;
    while (std::getline(in, line)) {
        std::istringstream ss(line);
        int np, nt; ss >> np >> nt;
        std::vector<llama_token> toks(nt); for (auto & t : toks) ss >> t;
        std::vector<std::vector<std::pair<int,float>>> ref(nt);
        for (int i = 0; i < nt; i++) for (int j = 0; j < 8; j++) { int id; float l; ss >> id >> l; ref[i].push_back({id, l}); }
        auto cp = llama_context_default_params();
        cp.n_ctx = 512; cp.n_batch = 512; cp.n_threads = 2; cp.n_threads_batch = 2;
        cp.flash_attn_type = getenv("FA_OFF") ? LLAMA_FLASH_ATTN_TYPE_DISABLED : LLAMA_FLASH_ATTN_TYPE_ENABLED; if (getenv("T1")) { cp.n_threads = 1; cp.n_threads_batch = 1; }
        llama_context * ctx = llama_init_from_model(model, cp);
        std::vector<std::vector<float>> logits;
        auto run = [&](int from, int to) {
            (void)0;
            llama_batch b = llama_batch_init(to - from, 0, 1);
            for (int i = from; i < to; i++) { b.token[b.n_tokens] = toks[i]; b.pos[b.n_tokens] = i; b.n_seq_id[b.n_tokens] = 1; b.seq_id[b.n_tokens][0] = 0; b.logits[b.n_tokens] = 1; b.n_tokens++; }
            llama_decode(ctx, b);
            for (int i = 0; i < to - from; i++) { float * l = llama_get_logits_ith(ctx, i); logits.emplace_back(l, l + nv); }
            llama_batch_free(b);
        };
        if (mode == 0) { run(0, np); for (int i = np; i < nt; i++) run(i, i + 1); }
        else if (mode == 1) { for (int i = 0; i < nt; i++) run(i, i + 1); }
        else { run(0, nt); }
        float worst = 0; int top1_bad = 0, top1_checked = 0;
        for (int i = 0; i < nt; i++) {
            float here = 0;
            for (auto & p : ref[i]) here = std::max(here, std::fabs(logits[i][p.first] - p.second));
            worst = std::max(worst, here);
            if (getenv("TRACE")) printf("trace %d %s %d %.4f\n", mode, i < np ? "prompt" : "greedy", i, here);
            if (ref[i][0].second - ref[i][1].second >= 0.1f) {
                top1_checked++;
                int best = 0; for (int v = 1; v < nv; v++) if (logits[i][v] > logits[i][best]) best = v;
                if (best != ref[i][0].first) top1_bad++;
            }
        }
        // free run: greedy from the prompt, compare with the golden greedy tokens
        llama_memory_clear(llama_get_memory(ctx), true);
        logits.clear();
        run(0, np);
        int parted = -1; float margin = 0;
        for (int j = 0; np + j < nt && j < 32; j++) {
            auto & l = logits.back(); int best = 0; for (int v = 1; v < nv; v++) if (l[v] > l[best]) best = v;
            if (best != toks[np + j]) { parted = j; margin = ref[np - 1 + j][0].second - ref[np - 1 + j][1].second; break; }
            run(np + j, np + j + 1);
        }
        printf("mode %d: prompt %d, %d positions: top-8 max diff %.4f, top-1 mismatches %d/%d, free run parts at %d (ref margin %.3f)\n", mode, np, nt, worst, top1_bad, top1_checked, parted, margin);
        llama_free(ctx);
    }
}
