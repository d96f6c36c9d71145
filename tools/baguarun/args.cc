// baguarun's command line: Bagua's and torchrun's flag names (both --flag_name and --flag-name),
// `--key value` and `--key=value`, then the program and its arguments.
#include <cstdio>
#include <string>

#include "bagua/base/params.h"
#include "bagua/cli_support/cli.h"
#include "baguarun.h"

namespace bagua::baguarun {

void usage(FILE* out) {
  std::fprintf(out,
               "Usage: baguarun [OPTIONS] [--] program [args...]\n"
               "       baguarun [--nproc_per_node N] [--nnodes M] [--node_rank R]\n"
               "                [--master_addr A] [--master_port P] [--grace_s S] [--] program "
               "[args...]\n"
               "       baguarun --host_list H1[:PORT],H2[:PORT],... [--ssh_port P] "
               "[--nproc_per_node N]\n"
               "                [--master_port P] [-x VAR[=VALUE]]... [--] program [args...]\n"
               "Starts N workers with torchrun's variables (MASTER_ADDR, MASTER_PORT, RANK,\n"
               "WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), forwards signals, and stops every\n"
               "worker when one fails, reporting which rank failed and why.\n"
               "  --master_port 0   pick a free port (single node)\n"
               "  --grace_s S       seconds between SIGTERM and SIGKILL (default 5)\n"
               "  --rank_prefix     put \"[rank R] \" before every line a worker prints\n"
               "On several hosts over SSH (node rank = position in the list; master: the first\n"
               "host, or --master_addr; without --host_list, BAGUA_NODE_DOMAIN_NAMES):\n"
               "  --ssh_port P      for hosts without :PORT (BAGUA_SSH_PORT; else ssh's own)\n"
               "  --ssh_opts OPTS   options for ssh, e.g. \"-i KEY\" (BAGUA_SSH_OPTS)\n"
               "  -x VAR[=VALUE]    also set VAR on every host (VALUE: else this one's)\n"
               "  --remote_baguarun PATH   baguarun on the hosts (default: this one's path)\n"
               "Elastic (torchrun underneath): --nnodes MIN:MAX, --rdzv_backend B (c10d),\n"
               "  --rdzv_endpoint HOST:PORT (--master_addr:--master_port), --rdzv_id ID,\n"
               "  --rdzv_conf K=V,..., --max_restarts R (3), --torchrun CMD\n"
               "  (python3 -m bagua.distributed.run)\n"
               "Bagua's flags: --no_python (a PROG.py runs directly, not as python3 -u PROG.py),\n"
               "  --enable_bagua_net (NCCL_NET_PLUGIN: this installation's Bagua-Net plugin),\n"
               "  --bagua_service_port P (BAGUA_SERVICE_PORT for the ranks)\n"
               "Every flag also as --flag-name, with its value as --flag VALUE or --flag=VALUE.\n"
               "  -h, --help        print this help and exit\n"
               "  --version         print baguarun's version and exit\n");
}

namespace {

// The one usage-error line (tools/cli_support): "baguarun: WHAT (see baguarun --help)".
bool fail(const std::string& what) {
  bagua::cli::usageError("baguarun", what);
  return false;
}

bool parseIntArg(const std::string& name, const std::string& text, int lo, int hi, int* out) {
  bagua::Result<int64_t> v = bagua::parseInt(text);
  if (!v.isOk() || *v < lo || *v > hi) {
    return fail(bagua::strPrintf("%s must be an integer in [%d, %d], got '%s'", name.c_str(), lo,
                                 hi, text.c_str()));
  }
  *out = static_cast<int>(*v);
  return true;
}

// The options that take no value.
bool isSwitch(const std::string& key) {
  return key == "--rank_prefix" || key == "--stdin_control" || key == "--no_python" ||
         key == "--enable_bagua_net";
}

// The options that take a value (canonical keys): applyOption's.
bool takesValue(const std::string& key) {
  for (const char* k :
       {"--nproc_per_node", "--nnodes", "--node_rank", "--master_addr", "--master_port",
        "--grace_s", "--rdzv_backend", "--rdzv_endpoint", "--rdzv_id", "--rdzv_conf",
        "--max_restarts", "--torchrun", "--host_list", "--ssh_port", "--ssh_opts",
        "--remote_baguarun", "--bagua_service_port", "-x"}) {
    if (key == k) {
      return true;
    }
  }
  return false;
}

// "--nproc-per-node" -> "--nproc_per_node": torchrun's users type dashes, Bagua's underscores.
std::string canonicalKey(std::string key) {
  for (size_t i = 2; i < key.size(); ++i) {
    if (key[i] == '-') {
      key[i] = '_';
    }
  }
  return key;
}

bool parseNnodes(const std::string& value, Options* o) {
  o->nnodesText = value;
  const size_t colon = value.find(':');
  if (colon == std::string::npos) {
    return parseIntArg("--nnodes", value, 1, 65536, &o->nnodes);
  }
  int lo = 0;
  int hi = 0;
  const bool ok = parseIntArg("--nnodes MIN", value.substr(0, colon), 1, 65536, &lo) &&
                  parseIntArg("--nnodes MAX", value.substr(colon + 1), lo, 65536, &hi);
  o->nnodes = hi;
  return ok;
}

// One option (canonical key) with its value: false after printing why it is bad; `*known`
// false for a key baguarun does not take.
bool applyOption(const std::string& key, const std::string& value, Options* o, bool* known) {
  *known = true;
  if (key == "--nproc_per_node") {
    return parseIntArg(key, value, 1, 4096, &o->nprocPerNode);
  }
  if (key == "--nnodes") {
    o->placementGiven = true;
    return parseNnodes(value, o);
  }
  if (key == "--node_rank") {
    o->placementGiven = true;
    return parseIntArg(key, value, 0, 65535, &o->nodeRank);
  }
  if (key == "--master_port") {
    return parseIntArg(key, value, 0, 65535, &o->masterPort);
  }
  if (key == "--max_restarts") {
    return parseIntArg(key, value, 0, 1 << 20, &o->maxRestarts);
  }
  if (key == "--bagua_service_port") {
    return parseIntArg(key, value, 0, 65535, &o->baguaServicePort);
  }
  if (key == "--ssh_port") {
    return parseIntArg(key, value, 1, 65535, &o->sshPort);
  }
  if (key == "--grace_s") {
    bagua::Result<double> g = bagua::parseDouble(value);
    if (!g.isOk() || *g < 0) {
      return fail("--grace_s must be a non-negative number, got '" + value + "'");
    }
    o->graceS = *g;
    return true;
  }
  std::string* text = nullptr;
  if (key == "--master_addr") {
    o->masterAddrGiven = true;
    text = &o->masterAddr;
  } else if (key == "--rdzv_backend") {
    text = &o->rdzvBackend;
  } else if (key == "--rdzv_endpoint") {
    text = &o->rdzvEndpoint;
  } else if (key == "--rdzv_id") {
    text = &o->rdzvId;
  } else if (key == "--rdzv_conf") {
    text = &o->rdzvConf;
  } else if (key == "--torchrun") {
    text = &o->torchrun;
  } else if (key == "--host_list") {
    text = &o->hostList;
  } else if (key == "--remote_baguarun") {
    text = &o->remoteBaguarun;
  } else if (key == "--ssh_opts") {
    o->sshOpts = value;
  } else if (key == "-x") {
    o->exportVars.push_back(value);
  } else {
    *known = false;
    return false;
  }
  if (text != nullptr) {
    *text = value;
  }
  return true;
}

// The checks across options, once all are read; false after printing why.
bool checkOptions(Options* o) {
  if (o->command.empty()) {
    return fail("no program given");
  }
  if (o->elastic()) {
    if (!o->hostList.empty()) {
      return fail(
          "--host_list starts a static job; an elastic one (--nnodes MIN:MAX, --rdzv_*) is "
          "started on each node by hand");
    }
    return true;  // ranks come from torchrun's rendezvous; --node_rank does not apply
  }
  if (!o->hostList.empty()) {
    return true;  // node ranks and --nnodes come from the host list (ssh.cc checks them)
  }
  if (o->nodeRank >= o->nnodes) {
    return fail(
        bagua::strPrintf("--node_rank %d must be below --nnodes %d", o->nodeRank, o->nnodes));
  }
  if (o->masterPort == 0 && o->nnodes > 1) {
    return fail("--master_port 0 (pick a free port) works on one node only");
  }
  return true;
}

}  // namespace

int parseArgs(int argc, char** argv, Options* o) {
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "-h" || a == "--help") {
      return -1;
    }
    if (a == "--version") {
      std::printf("baguarun %s\n", bagua::cli::version());
      return -2;
    }
    if (a.rfind("--", 0) != 0 && a.rfind("-x", 0) != 0) {
      break;  // the program
    }
    std::string key = a;
    std::string value;
    bool hasValue = false;
    if (a.rfind("-x", 0) == 0 && a.size() > 2) {
      key = "-x";  // -xVAR=VALUE, as Bagua's argparse took it
      value = a.substr(a[2] == '=' ? 3 : 2);
      hasValue = true;
    } else if (const size_t eq = a.find('='); eq != std::string::npos) {
      key = a.substr(0, eq);
      value = a.substr(eq + 1);
      hasValue = true;
    }
    const std::string typed = key;
    key = canonicalKey(key);
    if (isSwitch(key)) {
      if (hasValue) {
        fail(typed + " takes no value");
        return 2;
      }
      (key == "--rank_prefix"     ? o->rankPrefix
       : key == "--stdin_control" ? o->stdinControl
       : key == "--no_python"     ? o->noPython
                                  : o->enableBaguaNet) = true;
      continue;
    }
    if (!takesValue(key)) {
      fail("unknown option " + typed);
      return 2;
    }
    if (!hasValue) {
      if (i + 1 >= argc) {
        fail(a + " needs a value");
        return 2;
      }
      value = argv[++i];
    }
    bool known = true;
    if (!applyOption(key, value, o, &known)) {
      if (!known) {
        fail("unknown option " + typed);
      }
      return 2;
    }
  }
  for (; i < argc; ++i) {
    o->command.push_back(argv[i]);
  }
  return checkOptions(o) ? 0 : 2;
}

}  // namespace bagua::baguarun
