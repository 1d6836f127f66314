/*
 * gloo.cpp — the thin C++ shim over Debian's libgloo: the only C++ in Wick.
 *
 * It owns a Gloo context (TCP transport, full mesh) per process group, with Wick's store as the
 * Gloo Store that pairs exchange their addresses through (Gloo has file, hash, prefix and Redis
 * stores but no TCP one), and runs the collectives of dist.h on it: Gloo's own all-reduce,
 * broadcast, all-gather and barrier, and a ring reduce-scatter over Gloo's point-to-point
 * buffers. Reductions are runtime/dist/reduce.c's, so every dtype of wick.h works.
 *
 * Nothing C++ leaks out: every entry point catches every exception and turns it into a WkStatus
 * with the message recorded (a timeout is WK_ERR_TIMEOUT, a dropped peer WK_ERR_NETWORK). The
 * caller (comm.c) owns sequencing, progress and the hang report.
 */
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include "dist.h"

namespace {

/* Slots of Gloo's own collectives use prefixes 0x01..0x08 (gloo/types.h); ours stays clear. */
constexpr uint8_t kReduceScatterSlotPrefix = 0x20;

/* A failure of our store inside a Gloo call: carries Wick's status through Gloo's frames. */
struct StoreFailure : std::runtime_error {
  WkStatus status;
  StoreFailure(WkStatus s, const char *message) : std::runtime_error(message), status(s) {}
};

void check_store(WkStatus status) {
  if (status != WK_OK) throw StoreFailure(status, wk_last_error());
}

/* Gloo's Store interface over Wick's TCP store; every key is put under the group's prefix. */
class WickStore : public gloo::rendezvous::Store {
 public:
  WickStore(WkStore *store, const char *prefix, int64_t timeout_ms)
      : store_(store), prefix_(prefix), timeout_ms_(timeout_ms) {}

  void set(const std::string &key, const std::vector<char> &data) override {
    check_store(wk_store_set(store_, (prefix_ + key).c_str(), data.data(), data.size()));
  }

  std::vector<char> get(const std::string &key) override {
    uint8_t *value = nullptr;
    size_t length = 0;
    check_store(store_get_alloc(store_, (prefix_ + key).c_str(), timeout_ms_, &value, &length));
    std::vector<char> out(value, value + length);
    std::free(value);
    return out;
  }

  void wait(const std::vector<std::string> &keys) override {
    wait(keys, std::chrono::milliseconds(timeout_ms_));
  }

  void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &timeout) override {
    int64_t ms = timeout.count() > 0 && timeout.count() < timeout_ms_ ? timeout.count() : timeout_ms_;
    for (size_t first = 0; first < keys.size(); first += STORE_MAX_WAIT_KEYS) {
      std::vector<std::string> full;
      std::vector<const char *> names;
      for (size_t i = first; i < keys.size() && i < first + STORE_MAX_WAIT_KEYS; i++) full.push_back(prefix_ + keys[i]);
      for (const std::string &k : full) names.push_back(k.c_str());
      check_store(wk_store_wait(store_, names.data(), (uint32_t)names.size(), ms));
    }
  }

 private:
  WkStore *store_;
  std::string prefix_;
  int64_t timeout_ms_;
};

/* Runs body, turning whatever it throws into a recorded failure. */
template <typename Body>
WkStatus guarded(const char *what, Body body) {
  try {
    body();
    return WK_OK;
  } catch (const StoreFailure &e) {
    return WK_FAIL(e.status, "gloo %s: %s", what, e.what());
  } catch (const gloo::IoException &e) {
    bool timed_out = std::strstr(e.what(), "Timed out") || std::strstr(e.what(), "timed out");
    return WK_FAIL(timed_out ? WK_ERR_TIMEOUT : WK_ERR_NETWORK, "gloo %s: %s", what, e.what());
  } catch (const std::bad_alloc &) {
    return WK_FAIL(WK_ERR_NOMEM, "gloo %s: out of memory", what);
  } catch (const std::exception &e) {
    return WK_FAIL(WK_ERR_NETWORK, "gloo %s: %s", what, e.what());
  } catch (...) {
    return WK_FAIL(WK_ERR_INTERNAL, "gloo %s: an unknown C++ exception", what);
  }
}

std::chrono::milliseconds ms(int64_t timeout_ms) { return std::chrono::milliseconds(timeout_ms); }

/* Gloo sizes elements by sizeof(T); any type of the right width will do. */
template <typename Fn>
void with_element_type(size_t size, Fn fn) {
  switch (size) {
    case 1: fn(uint8_t{}); break;
    case 2: fn(uint16_t{}); break;
    case 4: fn(uint32_t{}); break;
    case 8: fn(uint64_t{}); break;
    default: throw std::invalid_argument("element size " + std::to_string(size) + " is not 1, 2, 4 or 8 bytes");
  }
}

}  // namespace

struct GlooGroup {
  std::unique_ptr<WickStore> store;
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::vector<uint8_t> scratch;  /* reduce-scatter's partial and received blocks */
};

extern "C" {

GlooGroup *gloo_connect(WkStore *store, const char *prefix, int rank, int size, const char *hostname,
                        int64_t timeout_ms) {
  GlooGroup *group = nullptr;
  WkStatus st = guarded("connect", [&] {
    std::unique_ptr<GlooGroup> g(new GlooGroup());
    g->store.reset(new WickStore(store, prefix, timeout_ms));
    gloo::transport::tcp::attr attr;
    attr.hostname = hostname;
    g->device = gloo::transport::tcp::CreateDevice(attr);
    g->context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    g->context->setTimeout(ms(timeout_ms));
    g->context->connectFullMesh(*g->store, g->device);
    group = g.release();
  });
  if (st != WK_OK) wk_error_context("connecting rank %d of %d at %s", rank, size, hostname);
  return group;
}

void gloo_free(GlooGroup *group) {
  /* Destructors close sockets and join Gloo's loop thread; they do not throw. */
  delete group;
}

WkStatus gloo_all_reduce(GlooGroup *g, void *data, size_t count, WkDType dtype, WkReduceOp op, uint32_t tag,
                         int64_t timeout_ms) {
  return guarded("all_reduce", [&] {
    gloo::AllreduceOptions opts(g->context);
    with_element_type(wk_dtype_size(dtype), [&](auto element) {
      opts.setOutput(static_cast<decltype(element) *>(data), count);
    });
    opts.setReduceFunction([dtype, op](void *out, const void *a, const void *b, size_t n) {
      dist_reduce(out, a, b, n, dtype, op);
    });
    opts.setTag(tag);
    opts.setTimeout(ms(timeout_ms));
    gloo::allreduce(opts);
  });
}

WkStatus gloo_broadcast(GlooGroup *g, void *data, size_t bytes, int root, uint32_t tag, int64_t timeout_ms) {
  return guarded("broadcast", [&] {
    gloo::BroadcastOptions opts(g->context);
    opts.setOutput(static_cast<uint8_t *>(data), bytes);
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(ms(timeout_ms));
    gloo::broadcast(opts);
  });
}

WkStatus gloo_all_gather(GlooGroup *g, void *out, const void *in, size_t bytes, uint32_t tag, int64_t timeout_ms) {
  return guarded("all_gather", [&] {
    gloo::AllgatherOptions opts(g->context);
    opts.setInput(static_cast<uint8_t *>(const_cast<void *>(in)), bytes);
    opts.setOutput(static_cast<uint8_t *>(out), bytes * (size_t)g->context->size);
    opts.setTag(tag);
    opts.setTimeout(ms(timeout_ms));
    gloo::allgather(opts);
  });
}

/* Ring reduce-scatter: in step k (0 .. N-2) rank r passes its partial sum of block (r - k - 1)
 * to rank r + 1 and adds its own block (r - k - 2) to the partial it receives from rank r - 1;
 * after N - 1 steps the partial of block r is complete, and lands in out. Each rank sends and
 * receives (N - 1) / N of the input, half of what an all-reduce would. */
WkStatus gloo_reduce_scatter(GlooGroup *g, void *out, const void *in, size_t count, WkDType dtype, WkReduceOp op,
                             uint32_t tag, int64_t timeout_ms) {
  return guarded("reduce_scatter", [&] {
    const int N = g->context->size, r = g->context->rank;
    const size_t block = count * wk_dtype_size(dtype);
    const uint8_t *input = static_cast<const uint8_t *>(in);
    auto block_at = [&](int b) { return (size_t)(((b % N) + N) % N) * block; };
    g->scratch.resize(3 * block); /* two partials in turn, then the block being received */
    uint8_t *partial[2] = {g->scratch.data(), g->scratch.data() + block}, *received = g->scratch.data() + 2 * block;
    /* One buffer per memory, so that no buffer has more than one operation pending. */
    auto from_input = g->context->createUnboundBuffer(const_cast<uint8_t *>(input), block * (size_t)N);
    std::unique_ptr<gloo::transport::UnboundBuffer> from_partial[2] = {
        g->context->createUnboundBuffer(partial[0], block), g->context->createUnboundBuffer(partial[1], block)};
    auto into_received = g->context->createUnboundBuffer(received, block);
    const uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, tag);
    const int next = (r + 1) % N, prev = (r + N - 1) % N;
    const auto deadline = std::chrono::steady_clock::now() + ms(timeout_ms);
    auto left = [&] {  /* never 0 or negative: Gloo reads -1 as "the context's default" */
      auto d = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      return d.count() > 0 ? d : std::chrono::milliseconds(1);
    };
    gloo::transport::UnboundBuffer *sending = from_input.get();
    for (int k = 0; k < N - 1; k++) {
      into_received->recv(prev, slot);
      int target = sending == from_partial[0].get() ? 1 : 0;
      if (k == 0) sending->send(next, slot, block_at(r - 1), block);
      else sending->send(next, slot);
      into_received->waitRecv(left());
      uint8_t *sum = k == N - 2 ? static_cast<uint8_t *>(out) : partial[target];
      dist_reduce(sum, received, input + block_at(r - k - 2), count, dtype, op);
      sending->waitSend(left());
      sending = from_partial[target].get();
    }
  });
}

WkStatus gloo_barrier(GlooGroup *g, uint32_t tag, int64_t timeout_ms) {
  return guarded("barrier", [&] {
    gloo::BarrierOptions opts(g->context);
    opts.setTag(tag);
    opts.setTimeout(ms(timeout_ms));
    gloo::barrier(opts);
  });
}

}  // extern "C"
