// llama-memory-bytes: llama.cpp's own memory projection in exact bytes, with the common CLI flags of the
// perplexity example (so -kvu/--kv-unified is accepted, unlike llama-fit-params in b11312).
//
// It does what llama-fit-params --fit-print on does (common/fit.cpp common_get_device_memory_data_impl:
// load with no_alloc=true, load_mode=NONE, create the context, read llama_get_memory_breakdown) but
// prints bytes per buffer type instead of MiB floored per device, as one JSON line on stdout.
//
// Why it exists: llama-fit-params in b11312 does not accept --kv-unified (common/arg.cpp:1724-1730
// registers it for server, perplexity, batched, bench and parallel only), and its MiB are floored;
// this prints bytes, for every flag of the perplexity example. Built by scripts/build-llamacpp.sh.

#include "arg.h"
#include "common.h"
#include "log.h"
#include "llama.h"
#include "ggml-backend.h"
#include "llama-ext.h"

#include <cstdio>
#include <string>
#include <vector>

static std::string jesc(const std::string & s) {
    std::string o;
    for (char c : s) {
        if (c == '"' || c == '\\') { o += '\\'; o += c; }
        else if ((unsigned char) c < 0x20) { char b[8]; snprintf(b, sizeof(b), "\\u%04x", c); o += b; }
        else o += c;
    }
    return o;
}

int main(int argc, char ** argv) {
    common_params params;
    common_init();
    if (!common_params_parse(argc, argv, params, LLAMA_EXAMPLE_PERPLEXITY)) {
        return 1;
    }
    llama_backend_init();
    llama_numa_init(params.numa);

    llama_model_params   mparams = common_model_params_to_llama(params);
    llama_context_params cparams = common_context_params_to_llama(params);
    mparams.no_alloc  = true;
    mparams.load_mode = LLAMA_LOAD_MODE_NONE;

    llama_model * model = llama_model_load_from_file(params.model.path.c_str(), mparams);
    if (!model) { fprintf(stderr, "llama-memory-bytes: failed to load model\n"); return 2; }
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (!ctx) { fprintf(stderr, "llama-memory-bytes: failed to create context\n"); llama_model_free(model); return 3; }

    const llama_memory_breakdown mb = llama_get_memory_breakdown(ctx);

    std::string out = "{\"type\":\"memory_bytes\",\"unit\":\"bytes\"";
    out += ",\"n_ctx\":" + std::to_string(llama_n_ctx(ctx));
    out += ",\"n_ctx_seq\":" + std::to_string(llama_n_ctx_seq(ctx));
    out += ",\"n_seq_max\":" + std::to_string(llama_n_seq_max(ctx));
    out += ",\"n_ubatch\":" + std::to_string(llama_n_ubatch(ctx));
    out += ",\"kv_unified\":" + std::string(cparams.kv_unified ? "true" : "false");
    out += ",\"buffer_types\":[";
    bool first = true;
    for (const auto & [buft, d] : mb) {
        ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
        if (!first) out += ",";
        first = false;
        out += "{\"name\":\"" + jesc(ggml_backend_buft_name(buft)) + "\"";
        out += ",\"is_host\":" + std::string(ggml_backend_buft_is_host(buft) ? "true" : "false");
        out += ",\"device\":\"" + jesc(dev ? ggml_backend_dev_name(dev) : "") + "\"";
        out += ",\"model\":" + std::to_string(d.model);
        out += ",\"context\":" + std::to_string(d.context);
        out += ",\"compute\":" + std::to_string(d.compute) + "}";
    }
    out += "],\"devices\":[";
    // the grouping of common/fit.cpp: host buffer types -> "Host"; others -> the model device they
    // belong to; anything else (e.g. CPU_REPACK) is left out of the per-device rows
    const int nd = llama_model_n_devices(model);
    std::vector<llama_memory_breakdown_data> per(nd + 1);
    for (const auto & [buft, d] : mb) {
        if (ggml_backend_buft_is_host(buft)) {
            per[nd].model += d.model; per[nd].context += d.context; per[nd].compute += d.compute;
            continue;
        }
        ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
        for (int i = 0; i < nd; i++) {
            if (dev && dev == llama_model_get_device(model, i)) {
                per[i].model += d.model; per[i].context += d.context; per[i].compute += d.compute;
                break;
            }
        }
    }
    for (int i = 0; i <= nd; i++) {
        if (i) out += ",";
        const std::string name = i < nd ? ggml_backend_dev_name(llama_model_get_device(model, i)) : "Host";
        out += "{\"name\":\"" + jesc(name) + "\"";
        out += ",\"model\":" + std::to_string(per[i].model);
        out += ",\"context\":" + std::to_string(per[i].context);
        out += ",\"compute\":" + std::to_string(per[i].compute) + "}";
    }
    out += "]}";
    common_log_flush(common_log_main());
    printf("%s\n", out.c_str());
    fflush(stdout);

    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
