// Checkpoints for exact resume: one file of named sections, each either tensors
// (name, dtype, element count, the bytes) or opaque bytes (an RNG's state, a data position, a
// library's own state blob such as the fused optimizer's), every section with a CRC-32.
//
//   CheckpointWriter w;
//   w.addTensors("model", model.parameters());          // copies the bytes now
//   w.addTensors("optimizer", opt.stateTensors());
//   w.addRng("rng", rng);
//   w.addBytes("data", position);
//   BAGUA_RETURN_IF_ERROR(w.commit("ckpt/latest.bgck"));  // atomic: whole old or whole new file
//   ...
//   BAGUA_ASSIGN_OR_RETURN(CheckpointReader r, CheckpointReader::open("ckpt/latest.bgck"));
//   BAGUA_RETURN_IF_ERROR(r.restoreTensors("model", model.parameters()));
//
// commit() writes "<path>.tmp.<pid>", fsyncs it, renames it over <path> and fsyncs the
// directory, so a process killed at any point leaves either the previous checkpoint or the new
// one, never a torn file. open() checks the magic, the version and every section's CRC and
// length: a damaged file is an error naming the section, never a silent partial restore.
// Restoring tensors requires every tensor of the list, with the same element count and dtype
// (the error names the tensor and both shapes); host memory only (a device tensor is refused
// with its name: copy it to the host first).
//
// Thread safety: a writer or reader is used by one thread at a time; different objects are
// independent. Tensor memory is read (addTensors) or written (restoreTensors) during the call
// only.
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "bagua/base/status.h"
#include "bagua/core/parameter.h"
#include "bagua/core/store.h"

namespace bagua::core {

class CheckpointWriter {
 public:
  // Adds (or replaces) a section of tensors, copying their bytes now. InvalidArgument for a
  // tensor that is not in host memory or has no data.
  Status addTensors(const std::string& section, const std::vector<Parameter>& tensors);
  void addBytes(const std::string& section, Bytes bytes);
  void addRng(const std::string& section, const std::mt19937_64& rng);
  void addInt(const std::string& section, int64_t value);
  // Writes every section to `path` atomically (see the file comment). The writer keeps its
  // sections (commit again to write another copy).
  Status commit(const std::string& path) const;

 private:
  std::map<std::string, Bytes> sections_;
};

class CheckpointReader {
 public:
  // Reads and verifies the whole file. NotFound when it does not exist; InvalidArgument when it is
  // damaged (bad magic, version, length or CRC, naming the section).
  static Result<CheckpointReader> open(const std::string& path);

  bool has(const std::string& section) const { return sections_.count(section) != 0; }
  std::vector<std::string> sections() const;
  // NotFound naming the section and the ones the file has.
  Result<Bytes> bytes(const std::string& section) const;
  Result<int64_t> integer(const std::string& section) const;
  Status restoreRng(const std::string& section, std::mt19937_64* rng) const;
  // Copies the saved tensors into `tensors` by name. Every tensor in the list must be in the
  // section with the same dtype and element count; tensors of the section that the list does
  // not name are an error too (a model that changed shape must not half-load).
  Status restoreTensors(const std::string& section, const std::vector<Parameter>& tensors) const;

 private:
  std::string path_;
  std::map<std::string, Bytes> sections_;
};

// CRC-32 (IEEE 802.3, the zlib polynomial) of `len` bytes, continuing from `crc` (0 to start).
uint32_t crc32(const void* data, size_t len, uint32_t crc = 0);

}  // namespace bagua::core
