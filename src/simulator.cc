/*!
 * \file simulator.cc
 * \brief The hot loops of tvm-pesto: the discrete-event plan simulator and a list scheduler.
 *
 * The simulator follows tvm_pesto/plan/reference.py exactly (same event order, same
 * floating-point operations in the same order), so its results equal the reference's.
 *
 * Both functions use destination-passing style: Python allocates every output, the C++
 * code fills it. All tensors are CPU, contiguous, int32 or float64.
 */
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <queue>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace tvm_pesto {

namespace ffi = tvm::ffi;

namespace {

/*! \brief Check a tensor's dtype, rank and layout and return its data pointer. */
template <typename T>
T* Data(const ffi::TensorView& t, const char* name, int ndim) {
  constexpr bool is_float = std::is_floating_point<T>::value;
  DLDataType dt = t.dtype();
  int want_code = is_float ? kDLFloat : kDLInt;
  if (dt.code != want_code || dt.bits != sizeof(T) * 8 || dt.lanes != 1) {
    TVM_FFI_THROW(TypeError) << name << " must be " << (is_float ? "float" : "int") << sizeof(T) * 8
                             << "; convert it with numpy before calling";
  }
  if (t.ndim() != ndim) {
    TVM_FFI_THROW(ValueError) << name << " must have " << ndim << " dimension(s), got " << t.ndim();
  }
  if (t.device().device_type != kDLCPU) {
    TVM_FFI_THROW(ValueError) << name << " must live in CPU memory";
  }
  if (!t.IsContiguous()) {
    TVM_FFI_THROW(ValueError) << name << " must be contiguous (use numpy.ascontiguousarray)";
  }
  return static_cast<T*>(t.data_ptr());
}

void CheckLen(const ffi::TensorView& t, const char* name, int64_t dim, int64_t want) {
  if (t.shape()[dim] != want) {
    TVM_FFI_THROW(ValueError) << name << " has size " << t.shape()[dim] << " along axis " << dim
                              << "; expected " << want;
  }
}

/*! \brief Edges as compressed rows: for each node, the positions of its outgoing edges. */
struct Csr {
  std::vector<int64_t> begin;  // size n + 1
  std::vector<int32_t> edge;   // edge ids grouped by source node

  Csr(int64_t n, int64_t m, const int32_t* src) : begin(n + 1, 0), edge(m) {
    for (int64_t e = 0; e < m; ++e) ++begin[src[e] + 1];
    for (int64_t i = 0; i < n; ++i) begin[i + 1] += begin[i];
    std::vector<int64_t> fill(begin.begin(), begin.end() - 1);
    for (int64_t e = 0; e < m; ++e) edge[fill[src[e]]++] = static_cast<int32_t>(e);
  }
};

void CheckEdges(int64_t n, int64_t m, const int32_t* src, const int32_t* dst) {
  for (int64_t e = 0; e < m; ++e) {
    if (src[e] < 0 || src[e] >= n || dst[e] < 0 || dst[e] >= n) {
      TVM_FFI_THROW(ValueError) << "edge " << e << " (" << src[e] << " -> " << dst[e]
                                << ") names a node outside 0.." << n - 1;
    }
  }
}

void CheckAssignment(int64_t n, int64_t d, const int32_t* assign) {
  for (int64_t v = 0; v < n; ++v) {
    if (assign[v] < 0 || assign[v] >= d) {
      TVM_FFI_THROW(ValueError) << "node " << v << " is assigned to device " << assign[v]
                                << ", outside 0.." << d - 1;
    }
  }
}

/*!
 * \brief For each producer, the destination devices it must send to (ascending) and the bytes
 * sent: the largest edge from that producer to that device. Stored as compressed rows.
 */
struct Sends {
  std::vector<int64_t> begin;
  std::vector<int32_t> device;
  std::vector<double> bytes;

  Sends(int64_t n, int64_t d, const Csr& out, const int32_t* dst, const double* ebytes,
        const int32_t* assign)
      : begin(n + 1, 0) {
    std::vector<double> best(d, 0.0);
    std::vector<int64_t> stamp(d, -1);
    std::vector<int32_t> touched;
    for (int64_t u = 0; u < n; ++u) {
      touched.clear();
      for (int64_t k = out.begin[u]; k < out.begin[u + 1]; ++k) {
        int32_t e = out.edge[k];
        int32_t dv = assign[dst[e]];
        if (dv == assign[u]) continue;
        if (stamp[dv] != u) {
          stamp[dv] = u;
          best[dv] = 0.0;  // the reference starts each pair's maximum at 0.0
          touched.push_back(dv);
        }
        best[dv] = std::max(best[dv], ebytes[e]);
      }
      std::sort(touched.begin(), touched.end());
      for (int32_t dv : touched) {
        device.push_back(dv);
        bytes.push_back(best[dv]);
      }
      begin[u + 1] = static_cast<int64_t>(device.size());
    }
  }
};

}  // namespace

/*!
 * \brief Simulate a plan; see tvm_pesto/plan/reference.py for the semantics.
 *
 * \param src, dst int32[m] edge endpoints; \param ebytes float64[m] edge sizes.
 * \param assign int32[n] device of each node.
 * \param order int32[n] all devices' orders concatenated; \param offsets int32[d+1] where each
 *        device's order starts and ends in \p order.
 * \param cost float64[n] seconds of each node on its device.
 * \param latency, inv_bw float64[d,d]; \param mem float64[n] resident bytes per node.
 * \param hosts int32[d] the host of each device: a transfer between hosts holds the sending
 *        host's outgoing and the receiving host's incoming NIC instead of its device link.
 * \param start, finish float64[n]; busy, peak float64[d]; transfers float64[k,6] (outputs).
 * \param blocked int32[d] output: on deadlock, the node each device waits at (-1 when idle).
 * \return The number of transfer rows written. Deadlock throws TvmPestoDeadlock.
 */
int64_t Simulate(ffi::TensorView src_t, ffi::TensorView dst_t, ffi::TensorView ebytes_t,
                 ffi::TensorView assign_t, ffi::TensorView order_t, ffi::TensorView offsets_t,
                 ffi::TensorView cost_t, ffi::TensorView latency_t, ffi::TensorView inv_bw_t,
                 ffi::TensorView mem_t, ffi::TensorView hosts_t, ffi::TensorView start_t,
                 ffi::TensorView finish_t, ffi::TensorView busy_t, ffi::TensorView peak_t,
                 ffi::TensorView transfers_t, ffi::TensorView blocked_t) {
  const int32_t* src = Data<int32_t>(src_t, "src", 1);
  const int32_t* dst = Data<int32_t>(dst_t, "dst", 1);
  const double* ebytes = Data<double>(ebytes_t, "ebytes", 1);
  const int32_t* assign = Data<int32_t>(assign_t, "assignment", 1);
  const int32_t* order = Data<int32_t>(order_t, "order", 1);
  const int32_t* offsets = Data<int32_t>(offsets_t, "order offsets", 1);
  const double* cost = Data<double>(cost_t, "cost", 1);
  const double* latency = Data<double>(latency_t, "latency", 2);
  const double* inv_bw = Data<double>(inv_bw_t, "inv_bw", 2);
  const double* mem = Data<double>(mem_t, "mem", 1);
  const int32_t* hosts = Data<int32_t>(hosts_t, "hosts", 1);
  double* start = Data<double>(start_t, "start", 1);
  double* finish = Data<double>(finish_t, "finish", 1);
  double* busy = Data<double>(busy_t, "busy", 1);
  double* peak = Data<double>(peak_t, "peak", 1);
  double* transfers = Data<double>(transfers_t, "transfers", 2);
  int32_t* blocked = Data<int32_t>(blocked_t, "blocked", 1);

  const int64_t n = assign_t.shape()[0];
  const int64_t m = src_t.shape()[0];
  const int64_t d = latency_t.shape()[0];
  CheckLen(dst_t, "dst", 0, m);
  CheckLen(ebytes_t, "ebytes", 0, m);
  CheckLen(order_t, "order", 0, n);
  CheckLen(offsets_t, "order offsets", 0, d + 1);
  CheckLen(cost_t, "cost", 0, n);
  CheckLen(latency_t, "latency", 1, d);
  CheckLen(inv_bw_t, "inv_bw", 0, d);
  CheckLen(inv_bw_t, "inv_bw", 1, d);
  CheckLen(mem_t, "mem", 0, n);
  CheckLen(hosts_t, "hosts", 0, d);
  CheckLen(start_t, "start", 0, n);
  CheckLen(finish_t, "finish", 0, n);
  CheckLen(busy_t, "busy", 0, d);
  CheckLen(peak_t, "peak", 0, d);
  CheckLen(transfers_t, "transfers", 1, 6);
  CheckLen(blocked_t, "blocked", 0, d);
  const int64_t max_rows = transfers_t.shape()[0];
  CheckEdges(n, m, src, dst);
  CheckAssignment(n, d, assign);
  int32_t num_hosts = 1;
  for (int64_t k = 0; k < d; ++k) {
    if (hosts[k] < 0) TVM_FFI_THROW(ValueError) << "device " << k << " has host " << hosts[k] << "; hosts are >= 0";
    num_hosts = std::max(num_hosts, hosts[k] + 1);
  }

  // Every node appears once, in the order of the device it is assigned to.
  if (offsets[0] != 0 || offsets[d] != n) {
    TVM_FFI_THROW(ValueError) << "order offsets must run from 0 to " << n;
  }
  {
    std::vector<char> seen(n, 0);
    for (int64_t k = 0; k < d; ++k) {
      if (offsets[k + 1] < offsets[k]) TVM_FFI_THROW(ValueError) << "order offsets must not decrease";
      for (int64_t i = offsets[k]; i < offsets[k + 1]; ++i) {
        int32_t v = order[i];
        if (v < 0 || v >= n) {
          TVM_FFI_THROW(ValueError) << "device " << k << "'s order names unknown node " << v;
        }
        if (assign[v] != k) {
          TVM_FFI_THROW(ValueError) << "node " << v << " is in device " << k
                                    << "'s order but assigned to " << assign[v];
        }
        if (seen[v]++) TVM_FFI_THROW(ValueError) << "node " << v << " appears twice in the orders";
      }
    }
  }

  Csr out(n, m, src);
  Sends sends(n, d, out, dst, ebytes, assign);

  // missing[v]: inputs (edges, with multiplicity) not yet on v's device.
  // ready[v]: the latest time among the inputs already there.
  std::vector<int64_t> missing(n, 0);
  for (int64_t e = 0; e < m; ++e) ++missing[dst[e]];
  std::vector<double> ready(n, 0.0);
  std::vector<double> dev_free(d, 0.0), link_free(d * d, 0.0), arrive_at(d, 0.0);
  std::vector<double> nic_out(num_hosts, 0.0), nic_in(num_hosts, 0.0);  // when each host's NIC is free
  std::vector<int64_t> pos(d);
  std::vector<char> head_started(d, 0);
  for (int64_t k = 0; k < d; ++k) {
    pos[k] = offsets[k];
    busy[k] = 0.0;
    peak[k] = 0.0;
  }
  for (int64_t v = 0; v < n; ++v) {
    start[v] = std::nan("");
    finish[v] = std::nan("");
    peak[assign[v]] += mem[v];
  }

  using Event = std::pair<double, int32_t>;  // (finish time, node): the reference's heap key
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events;

  auto try_start = [&](int64_t k) {
    if (head_started[k] || pos[k] >= offsets[k + 1]) return;
    int32_t v = order[pos[k]];
    if (missing[v] != 0) return;
    double t = std::max(dev_free[k], ready[v]);
    start[v] = t;
    finish[v] = t + cost[v];
    dev_free[k] = finish[v];
    busy[k] += cost[v];
    head_started[k] = 1;
    events.emplace(finish[v], v);
    // Its outputs are now available to later nodes on the same device.
    for (int64_t j = out.begin[v]; j < out.begin[v + 1]; ++j) {
      int32_t w = dst[out.edge[j]];
      if (assign[w] == k) {
        --missing[w];
        ready[w] = std::max(ready[w], finish[v]);
      }
    }
  };

  for (int64_t k = 0; k < d; ++k) try_start(k);
  int64_t done = 0, rows = 0;
  while (!events.empty()) {
    auto [t, v] = events.top();
    events.pop();
    const int32_t du = assign[v];
    ++pos[du];
    head_started[du] = 0;
    ++done;
    for (int64_t j = sends.begin[v]; j < sends.begin[v + 1]; ++j) {
      const int32_t dv = sends.device[j];
      const double b = sends.bytes[j];
      const int32_t hu = hosts[du], hv = hosts[dv];
      const double s = hu == hv ? std::max(t, link_free[du * d + dv])
                                : std::max(std::max(t, nic_out[hu]), nic_in[hv]);
      const double e = s + latency[du * d + dv] + b * inv_bw[du * d + dv];
      if (hu == hv) {
        link_free[du * d + dv] = e;
      } else {
        nic_out[hu] = e;
        nic_in[hv] = e;
      }
      arrive_at[dv] = e;
      peak[dv] += b;
      if (rows >= max_rows) {
        TVM_FFI_THROW(ValueError) << "the transfers buffer holds " << max_rows
                                  << " rows; the plan needs more";
      }
      double* row = transfers + rows * 6;
      row[0] = v;
      row[1] = du;
      row[2] = dv;
      row[3] = s;
      row[4] = e;
      row[5] = b;
      ++rows;
    }
    for (int64_t j = out.begin[v]; j < out.begin[v + 1]; ++j) {
      int32_t w = dst[out.edge[j]];
      int32_t dw = assign[w];
      if (dw != du) {
        --missing[w];
        ready[w] = std::max(ready[w], arrive_at[dw]);
      }
    }
    try_start(du);
    for (int64_t j = sends.begin[v]; j < sends.begin[v + 1]; ++j) try_start(sends.device[j]);
  }

  if (done != n) {
    std::ostringstream os;
    os << "the plan deadlocks: devices wait forever at nodes [";
    bool first = true;
    for (int64_t k = 0; k < d; ++k) {
      blocked[k] = -1;
      if (pos[k] < offsets[k + 1]) {
        blocked[k] = order[pos[k]];
        os << (first ? "" : ", ") << blocked[k];
        first = false;
      }
    }
    os << "]; each device's order must agree with the graph's dependencies";
    TVM_FFI_THROW(TvmPestoDeadlock) << os.str();
  }
  return rows;
}

/*!
 * \brief Insertion-free list scheduling with a fixed assignment.
 *
 * Takes ready nodes (all predecessors placed) one at a time, smallest (priority, id) first,
 * and appends each to its device's order at its earliest start: when the device is free and
 * every input has arrived. An input from another device arrives ``latency + bytes * inv_bw``
 * after its producer finishes, with bytes the largest edge from the producer to that device
 * (the simulator's transfer size); link contention is ignored (the simulator adds it).
 *
 * \param cost float64[n,d]; \param priority float64[n]; \param assign int32[n].
 * \param order int32[n] (output) the devices' orders concatenated, device by device.
 * \param offsets int32[d+1] (output); \param start, finish float64[n] (output) estimates.
 * \return The number of nodes scheduled; fewer than n means the graph has a cycle.
 */
int64_t ListSchedule(ffi::TensorView src_t, ffi::TensorView dst_t, ffi::TensorView ebytes_t,
                     ffi::TensorView cost_t, ffi::TensorView latency_t, ffi::TensorView inv_bw_t,
                     ffi::TensorView priority_t, ffi::TensorView assign_t, ffi::TensorView order_t,
                     ffi::TensorView offsets_t, ffi::TensorView start_t, ffi::TensorView finish_t) {
  const int32_t* src = Data<int32_t>(src_t, "src", 1);
  const int32_t* dst = Data<int32_t>(dst_t, "dst", 1);
  const double* ebytes = Data<double>(ebytes_t, "ebytes", 1);
  const double* cost = Data<double>(cost_t, "cost", 2);
  const double* latency = Data<double>(latency_t, "latency", 2);
  const double* inv_bw = Data<double>(inv_bw_t, "inv_bw", 2);
  const double* priority = Data<double>(priority_t, "priority", 1);
  const int32_t* assign = Data<int32_t>(assign_t, "assignment", 1);
  int32_t* order = Data<int32_t>(order_t, "order", 1);
  int32_t* offsets = Data<int32_t>(offsets_t, "order offsets", 1);
  double* start = Data<double>(start_t, "start", 1);
  double* finish = Data<double>(finish_t, "finish", 1);

  const int64_t n = assign_t.shape()[0];
  const int64_t m = src_t.shape()[0];
  const int64_t d = latency_t.shape()[0];
  CheckLen(dst_t, "dst", 0, m);
  CheckLen(ebytes_t, "ebytes", 0, m);
  CheckLen(cost_t, "cost", 0, n);
  CheckLen(cost_t, "cost", 1, d);
  CheckLen(latency_t, "latency", 1, d);
  CheckLen(inv_bw_t, "inv_bw", 0, d);
  CheckLen(inv_bw_t, "inv_bw", 1, d);
  CheckLen(priority_t, "priority", 0, n);
  CheckLen(order_t, "order", 0, n);
  CheckLen(offsets_t, "order offsets", 0, d + 1);
  CheckLen(start_t, "start", 0, n);
  CheckLen(finish_t, "finish", 0, n);
  CheckEdges(n, m, src, dst);
  CheckAssignment(n, d, assign);

  Csr out(n, m, src);
  Sends sends(n, d, out, dst, ebytes, assign);
  std::vector<int64_t> indeg(n, 0);
  for (int64_t e = 0; e < m; ++e) ++indeg[dst[e]];
  std::vector<double> ready(n, 0.0), dev_free(d, 0.0);
  std::vector<std::vector<int32_t>> seq(d);

  using Item = std::pair<double, int32_t>;  // (priority, node)
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap;
  for (int64_t v = 0; v < n; ++v) {
    start[v] = std::nan("");
    finish[v] = std::nan("");
    if (indeg[v] == 0) heap.emplace(priority[v], static_cast<int32_t>(v));
  }
  std::vector<double> arrive_at(d, 0.0);
  int64_t placed = 0;
  while (!heap.empty()) {
    int32_t v = heap.top().second;
    heap.pop();
    const int32_t k = assign[v];
    const double t = std::max(dev_free[k], ready[v]);
    start[v] = t;
    finish[v] = t + cost[v * d + k];
    dev_free[k] = finish[v];
    seq[k].push_back(v);
    ++placed;
    for (int64_t j = sends.begin[v]; j < sends.begin[v + 1]; ++j) {
      const int32_t dv = sends.device[j];
      arrive_at[dv] = finish[v] + latency[k * d + dv] + sends.bytes[j] * inv_bw[k * d + dv];
    }
    for (int64_t j = out.begin[v]; j < out.begin[v + 1]; ++j) {
      const int32_t w = dst[out.edge[j]];
      const int32_t dw = assign[w];
      ready[w] = std::max(ready[w], dw == k ? finish[v] : arrive_at[dw]);
      if (--indeg[w] == 0) heap.emplace(priority[w], w);
    }
  }
  int64_t at = 0;
  offsets[0] = 0;
  for (int64_t k = 0; k < d; ++k) {
    for (int32_t v : seq[k]) order[at++] = v;
    offsets[k + 1] = static_cast<int32_t>(at);
  }
  return placed;
}

}  // namespace tvm_pesto

TVM_FFI_DLL_EXPORT_TYPED_FUNC(simulate, tvm_pesto::Simulate);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(list_schedule, tvm_pesto::ListSchedule);
