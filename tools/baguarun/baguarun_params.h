// baguarun's parameter catalogue: the environment variables of its SSH start (Bagua's names where
// Bagua had them). The command-line flags beat them; `bagua-params` lists them.
//
// Thread safety: see bagua/base/params.h (values are read once and then frozen).
#pragma once

#include "bagua/base/params.h"

namespace bagua::baguarun {

struct BaguarunParams : ParamCatalogue {
  BaguarunParams() : ParamCatalogue("baguarun", "the launcher's start on several hosts over SSH") {}

  StringParam nodeDomainNames{
      *this, "BAGUA_NODE_DOMAIN_NAMES", "",
      "the hosts of an SSH start when --host_list is not given (Bagua's variable): "
      "HOST[:PORT],HOST[:PORT],... in node-rank order; empty: no SSH start, the ranks run on this "
      "host. Only read when no --nnodes or --node_rank is given, so the baguarun it starts on "
      "each host never starts another",
      "comma-separated HOST or HOST:PORT, or empty"};
  IntParam sshPort{*this,
                   "BAGUA_SSH_PORT",
                   0,
                   {0, 65535},
                   "ssh port of the hosts that --host_list gives without :PORT, when --ssh_port "
                   "is not given (Bagua's variable); 0: ssh's own choice (~/.ssh/config, else 22)"};
  StringParam sshOpts{
      *this, "BAGUA_SSH_OPTS", "",
      "options for every ssh that baguarun runs, split at white space (no quoting), when "
      "--ssh_opts is not given; they come before baguarun's own options, so they win (ssh keeps "
      "the first value of each). E.g. `-i /path/key -o UserKnownHostsFile=/path/known_hosts`; "
      "empty: ~/.ssh/config and the defaults alone",
      "ssh options separated by white space, or empty"};
};

BaguarunParams& baguarunParams();

}  // namespace bagua::baguarun
