// Save and load cases of the PS conformance suite: a FULL save loads onto a
// different server count with identical rows and optimizer state; BASE +
// DELTA restore the latest values.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>

#include "ps_conformance_internal.h"
#include "dtrain/buffer.h"
#include "dtrain/error.h"

namespace dtrain::conformance::psc {

namespace {

namespace fs = std::filesystem;

Keys pool_of(uint64_t seed, size_t n, size_t from = 0) {
  Keys k;
  for (size_t i = from; i < from + n; ++i) k.push_back(mix(seed, i, 4242));
  return k;
}

// Worker u's step n on a sparse table: small gradients for a subset of keys
// (every key with all).
void sparse_step(ps::SparseTable& t, uint64_t seed, int u, int n, const Keys& keys, bool all = false) {
  Keys ks;
  for (auto k : keys)
    if (all || mix(seed, u, n, k) % 3 != 0) ks.push_back(k);
  if (ks.empty()) ks.push_back(keys[0]);
  Floats g(ks.size() * t.dim());
  for (size_t i = 0; i < g.size(); ++i) g[i] = small_grad(seed, u * 1000 + n, i, 1);
  t.push(ks.data(), ks.size(), fbuf(g))->wait();
}
void dense_step(ps::DenseTable& t, uint64_t seed, int u, int n) {
  Floats g(t.dim());
  for (size_t i = 0; i < g.size(); ++i) g[i] = small_grad(seed, u, n, i);
  t.push(fbuf(g))->wait();
}

struct Tables {
  ps::SparseTable adam, adagrad;
  ps::DenseTable dense;
};
Tables declare(ps::PsWorker& w) {
  const uint64_t seed = 81;
  return {w.sparse_table(table_config("emb_adam", ps::TableKind::Sparse, 8, ps::Optimizer::Adam, seed)),
          w.sparse_table(table_config("emb_adagrad", ps::TableKind::Sparse, 8, ps::Optimizer::Adagrad, seed)),
          w.dense_table(table_config("dense_adam", ps::TableKind::Dense, 37, ps::Optimizer::Adam, seed))};
}

// Steps [from, to) of every table; then every worker pulls (so its last step
// is applied) and the workers meet.
void train(Ctx& c, Tables& t, const Keys& keys, int from, int to) {
  for (int n = from; n < to; ++n) {
    sparse_step(t.adam, 81, c.w, n, keys);
    sparse_step(t.adagrad, 82, c.w, n, keys);
    dense_step(t.dense, 83, c.w, n);
  }
  pull(t.adam, keys), pull(t.adagrad, keys), pull(t.dense);
  c.barrier();
}

struct Snapshot {
  Floats adam, adagrad, dense;
};
Snapshot snap(Tables& t, const Keys& keys) { return {pull(t.adam, keys), pull(t.adagrad, keys), pull(t.dense)}; }

std::string diff(const Snapshot& got, const Snapshot& want, const Keys& keys, const std::string& what) {
  if (want.dense.empty()) return "no values from the saving job (it failed)";
  std::string e = compare(got.adam.data(), want.adam.data(), got.adam.size(), 8, keys.data(), what + ", sparse adam");
  if (e.empty())
    e = compare(got.adagrad.data(), want.adagrad.data(), got.adagrad.size(), 8, keys.data(), what + ", sparse adagrad");
  if (e.empty()) e = compare(got.dense.data(), want.dense.data(), got.dense.size(), 37, nullptr, what + ", dense adam");
  return e;
}

struct Scratch {
  fs::path dir;
  explicit Scratch(const std::string& base) {
    fs::path root = base.empty() ? fs::temp_directory_path() : fs::path(base);
    std::string tmpl = (root / "dtrain-ps-conformance-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw IoError("cannot create a folder under " + root.string());
    dir = tmpl;
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

std::string job_error(const std::string& which, const std::vector<std::string>& errs) {
  return errs[0].empty() ? "" : which + ": " + errs[0];
}

std::string full_case(const std::shared_ptr<Backend>& b, const Recorder& rec, int from_s, int to_s,
                      ps::SaveFormat format, const std::string& dir, int n) {
  const int W = 2;
  const Keys keys = pool_of(81, 40);
  Snapshot saved, cont;
  Job a;
  a.servers = from_s, a.workers = W, a.mode.mode = ps::Mode::Sync, a.name = "psconf-save-a-" + std::to_string(n);
  Body save_body = [&](Ctx& c) {
    Tables t = declare(*c.worker);
    train(c, t, keys, 0, 3);
    if (c.w == 0) {
      t.adam.save(dir, ps::SaveMode::Full, format)->wait();
      t.adagrad.save(dir, ps::SaveMode::Full, format)->wait();
      t.dense.save(dir, ps::SaveMode::Full, format)->wait();
    }
    c.barrier();
    Snapshot s = snap(t, keys);
    train(c, t, keys, 3, 5);
    Snapshot s2 = snap(t, keys);
    if (c.w == 0) saved = s, cont = s2;
    return std::string();
  };
  std::string e = job_error("the saving job", run_job(b, rec.o, a, {{"save", save_body}}));
  if (!e.empty()) return e;

  Job l = a;
  l.servers = to_s, l.name = "psconf-save-b-" + std::to_string(n);
  Body load_body = [&](Ctx& c) {
    Tables t = declare(*c.worker);
    if (c.w == 0) {
      t.adam.load(dir)->wait();
      t.adagrad.load(dir)->wait();
      t.dense.load(dir)->wait();
    }
    c.barrier();
    std::string err = diff(snap(t, keys), saved, keys, "pulled after the load");
    // Continued training shows the optimizer state (adam's m, v, t; adagrad's g2sum) came back too.
    train(c, t, keys, 3, 5);
    if (err.empty()) err = diff(snap(t, keys), cont, keys, "after 2 more steps on the loaded tables");
    return err;
  };
  return job_error("the loading job", run_job(b, rec.o, l, {{"load", load_body}}));
}

std::string base_delta_case(const std::shared_ptr<Backend>& b, const Recorder& rec, const std::string& root) {
  const std::string base_dir = root + "/base", delta_dir = root + "/delta";
  const Keys old_keys = pool_of(91, 24), new_keys = pool_of(91, 8, 100);
  Keys changed(old_keys.begin(), old_keys.begin() + 8);  // trained after the BASE save
  changed.insert(changed.end(), new_keys.begin(), new_keys.end());
  const Keys untouched(old_keys.begin() + 8, old_keys.end());
  Keys all = old_keys;
  all.insert(all.end(), new_keys.begin(), new_keys.end());
  auto cfg = table_config("ctr", ps::TableKind::Sparse, 8, ps::Optimizer::Adagrad, 91);
  Floats init, base_vals, final_vals;

  Job a;
  a.servers = 2, a.workers = 2, a.mode.mode = ps::Mode::Sync, a.name = "psconf-delta-a";
  Body save_body = [&](Ctx& c) {
    auto t = c.worker->sparse_table(cfg);
    Floats i0 = pull(t, all);  // the initial rows of every key
    c.barrier();
    for (int n = 0; n < 2; ++n) sparse_step(t, 91, c.w, n, old_keys);
    pull(t, old_keys);
    c.barrier();
    if (c.w == 0) t.save(base_dir, ps::SaveMode::Base)->wait();
    c.barrier();
    Floats bv = pull(t, all);
    for (int n = 2; n < 4; ++n) sparse_step(t, 91, c.w, n, changed, true);
    pull(t, changed);
    c.barrier();
    if (c.w == 0) t.save(delta_dir, ps::SaveMode::Delta)->wait();
    c.barrier();
    Floats fv = pull(t, all);
    if (c.w == 0) init = i0, base_vals = bv, final_vals = fv;
    return std::string();
  };
  std::string e = job_error("the saving job", run_job(b, rec.o, a, {{"save", save_body}}));
  if (!e.empty()) return e;

  auto rows = [&](const Floats& v, const Keys& of) {  // the rows of `of` in v (laid out as `all`)
    Floats out;
    for (auto k : of) {
      size_t j = std::find(all.begin(), all.end(), k) - all.begin();
      out.insert(out.end(), v.begin() + j * 8, v.begin() + (j + 1) * 8);
    }
    return out;
  };
  Job l;
  l.servers = 3, l.workers = 1, l.mode.mode = ps::Mode::Sync, l.name = "psconf-delta-b";
  Body load_body = [&](Ctx& c) {
    auto t = c.worker->sparse_table(cfg);
    // The DELTA alone holds only the rows changed after the BASE save.
    t.load(delta_dir)->wait();
    std::string err = compare(pull(t, changed).data(), rows(final_vals, changed).data(), changed.size() * 8, 8,
                              changed.data(), "the DELTA save alone, changed rows");
    if (err.empty())
      err = compare(pull(t, untouched).data(), rows(init, untouched).data(), untouched.size() * 8, 8, untouched.data(),
                    "the DELTA save alone, rows it must not hold (they pull their initial rows)");
    t.load(base_dir)->wait();
    if (err.empty())
      err = compare(pull(t, old_keys).data(), rows(base_vals, old_keys).data(), old_keys.size() * 8, 8, old_keys.data(),
                    "after loading the BASE save");
    t.load(delta_dir)->wait();
    if (err.empty())
      err = compare(pull(t, all).data(), final_vals.data(), all.size() * 8, 8, all.data(),
                    "after loading BASE, then DELTA");
    (void)c;
    return err;
  };
  return job_error("the loading job", run_job(b, rec.o, l, {{"load", load_body}}));
}

}  // namespace

void run_save_cases(const std::shared_ptr<Backend>& b, Recorder& rec) {
  struct Spec {
    int from, to;
    ps::SaveFormat format;
  };
  const Spec specs[] = {{1, 3, ps::SaveFormat::Binary}, {3, 2, ps::SaveFormat::Text}, {2, 1, ps::SaveFormat::Binary}};
  int n = 0;
  for (const auto& s : specs) {
    std::string name = "save/full/S" + std::to_string(s.from) + "->S" + std::to_string(s.to) + "/" +
                       (s.format == ps::SaveFormat::Text ? "text" : "binary");
    if (!rec.wanted(name)) continue;
    std::string e;
    try {
      Scratch dir(rec.o.scratch_dir);
      e = full_case(b, rec, s.from, s.to, s.format, dir.dir.string(), n++);
    } catch (const std::exception& ex) {
      e = std::string("threw: ") + ex.what();
    }
    rec.record(name, e);
  }
  const std::string bd = "save/base_delta/S2->S3";
  if (rec.wanted(bd)) {
    std::string e;
    try {
      Scratch dir(rec.o.scratch_dir);
      e = base_delta_case(b, rec, dir.dir.string());
    } catch (const std::exception& ex) {
      e = std::string("threw: ") + ex.what();
    }
    rec.record(bd, e);
  }
}

}  // namespace dtrain::conformance::psc
