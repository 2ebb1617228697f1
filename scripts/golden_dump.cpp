// Reference outputs from llama.cpp in the golden format of ../shared/golden/README.md, for the
// tiny architecture fixtures (scripts/make_tiny_models.py). Built and run by make_tiny_models.py:
//   g++ -O2 -std=c++17 scripts/golden_dump.cpp -I"$src/include" -I"$src/ggml/include" \
//     -L"$src/build/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$src/build/bin" -o .bench/golden_dump
// Usage: golden_dump MODEL.gguf PROMPTS.jsonl N_GREEDY > MODEL.jsonl
// PROMPTS.jsonl: one {"prompt": TEXT, "add_special": BOOL} per line (printed back as given, so a
// prompt is JSON-escaped by the script that wrote it; this program only copies it).
// As the golden files were made: the prompt as one batch, then each greedy token alone; flash
// attention on, 2 threads.
#include "llama.h"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

// The value of "key" in a flat JSON object line: a string (returned with its escapes as written)
// or a bare literal.
static std::string raw_field(const std::string & line, const std::string & key) {
    size_t k = line.find("\"" + key + "\"");
    if (k == std::string::npos) { fprintf(stderr, "no %s in %s\n", key.c_str(), line.c_str()); exit(1); }
    size_t p = line.find(':', k) + 1;
    while (line[p] == ' ') p++;
    if (line[p] == '"') {
        size_t e = p + 1;
        while (line[e] != '"') e += line[e] == '\\' ? 2 : 1;
        return line.substr(p, e - p + 1);
    }
    size_t e = line.find_first_of(",}", p);
    return line.substr(p, e - p);
}

// Minimal JSON string decoding: the escapes Python's json.dumps(ensure_ascii=False) writes.
static std::string unescape(const std::string & q) {
    std::string out;
    for (size_t i = 1; i + 1 < q.size(); i++) {
        if (q[i] != '\\') { out += q[i]; continue; }
        char c = q[++i];
        switch (c) {
            case 'n': out += '\n'; break;
            case 't': out += '\t'; break;
            case 'r': out += '\r'; break;
            case 'u': {
                unsigned cp = std::stoul(q.substr(i + 1, 4), nullptr, 16); i += 4;
                if (cp < 0x80) out += char(cp);
                else if (cp < 0x800) { out += char(0xC0 | cp >> 6); out += char(0x80 | (cp & 63)); }
                else { out += char(0xE0 | cp >> 12); out += char(0x80 | (cp >> 6 & 63)); out += char(0x80 | (cp & 63)); }
                break;
            }
            default: out += c;
        }
    }
    return out;
}

static std::string json_string(const std::string & s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') { out += '\\'; out += char(c); }
        else if (c == '\n') out += "\\n";
        else if (c == '\t') out += "\\t";
        else if (c == '\r') out += "\\r";
        else if (c < 0x20) { char b[8]; snprintf(b, sizeof b, "\\u%04x", c); out += b; }
        else out += char(c);
    }
    return out + "\"";
}

// {"logsumexp": x, "top": [[id, logit] x 8]} of one row of logits; the logits with 9 significant
// digits, which give back the same f32 (the golden files print 6 decimals), so a test can
// compare bits.
static std::string step_json(const float * l, int nv) {
    std::vector<int> idx(nv);
    for (int i = 0; i < nv; i++) idx[i] = i;
    std::partial_sort(idx.begin(), idx.begin() + 8, idx.end(), [&](int a, int b) {
        return l[a] > l[b] || (l[a] == l[b] && a < b);
    });
    double m = l[idx[0]], s = 0;
    for (int i = 0; i < nv; i++) s += std::exp((double) l[i] - m);
    char buf[64];
    snprintf(buf, sizeof buf, "{\"logsumexp\": %.6f, \"top\": [", m + std::log(s));
    std::string out = buf;
    for (int j = 0; j < 8; j++) {
        snprintf(buf, sizeof buf, "%s[%d, %.9g]", j ? ", " : "", idx[j], l[idx[j]]);
        out += buf;
    }
    return out + "]}";
}

int main(int argc, char ** argv) {
    if (argc != 4) { fprintf(stderr, "usage: golden_dump MODEL.gguf PROMPTS.jsonl N_GREEDY\n"); return 2; }
    llama_backend_init();
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int nv = llama_vocab_n_tokens(vocab);
    const int n_greedy = atoi(argv[3]);
    std::ifstream in(argv[2]);
    std::string line;
    while (std::getline(in, line)) {
        std::string prompt_json = raw_field(line, "prompt");
        bool add_special = raw_field(line, "add_special") == "true";
        std::string prompt = unescape(prompt_json);
        std::vector<llama_token> toks(prompt.size() + 8);
        int n = llama_tokenize(vocab, prompt.c_str(), prompt.size(), toks.data(), toks.size(), add_special, true);
        if (n < 0) { fprintf(stderr, "tokenize failed\n"); return 1; }
        toks.resize(n);

        auto cp = llama_context_default_params();
        cp.n_ctx = 512; cp.n_batch = 512; cp.n_ubatch = 512;
        cp.n_threads = 2; cp.n_threads_batch = 2;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
        llama_context * ctx = llama_init_from_model(model, cp);
        auto run = [&](const llama_token * t, int count, int pos0) {
            llama_batch b = llama_batch_init(count, 0, 1);
            for (int i = 0; i < count; i++) {
                b.token[i] = t[i]; b.pos[i] = pos0 + i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = 1;
            }
            b.n_tokens = count;
            if (llama_decode(ctx, b) != 0) { fprintf(stderr, "decode failed\n"); exit(1); }
            llama_batch_free(b);
        };
        std::string prompt_steps;
        run(toks.data(), n, 0);
        for (int i = 0; i < n; i++) prompt_steps += (i ? ", " : "") + step_json(llama_get_logits_ith(ctx, i), nv);
        std::vector<llama_token> greedy;
        std::string greedy_steps;
        const float * last = llama_get_logits_ith(ctx, n - 1);
        for (int j = 0; j < n_greedy; j++) {
            llama_token best = int(std::max_element(last, last + nv) - last);
            greedy.push_back(best);
            run(&best, 1, n + j);
            last = llama_get_logits_ith(ctx, 0);
            greedy_steps += (j ? ", " : "") + step_json(last, nv);
            if (llama_vocab_is_eog(vocab, best)) break;
        }
        // The pieces concatenated (token_to_piece, special tokens not rendered), as the golden
        // files' greedy_text.
        std::string greedy_text;
        for (llama_token t : greedy) {
            char piece[256];
            int pl = llama_token_to_piece(vocab, t, piece, sizeof piece, 0, false);
            greedy_text.append(piece, std::max(pl, 0));
        }

        std::string ts, gs;
        for (int i = 0; i < n; i++) ts += (i ? ", " : "") + std::to_string(toks[i]);
        for (size_t i = 0; i < greedy.size(); i++) gs += (i ? ", " : "") + std::to_string(greedy[i]);
        printf("{\"prompt\": %s, \"add_special\": %s, \"tokens\": [%s], \"prompt_logits\": [%s], "
               "\"greedy_tokens\": [%s], \"greedy_steps\": [%s], \"greedy_text\": %s}\n",
               prompt_json.c_str(), add_special ? "true" : "false", ts.c_str(), prompt_steps.c_str(),
               gs.c_str(), greedy_steps.c_str(), json_string(greedy_text).c_str());
        llama_free(ctx);
    }
    llama_model_free(model);
}
