// dtrain-ctr JOB.toml [-o key=value]...      train (server or worker, as the role says)
// dtrain-ctr gen --dir D [--train_lines N]   write click logs from a teacher model
// dtrain-ctr predict JOB.toml --model DIR --input FILE [--output FILE]
//
// Wide & deep click-through-rate prediction on the parameter server. Started
// by `dtrain --server_num 1 --worker_num 2 apps/ctr.toml`.

#include "ctr/ctr.h"

int main(int argc, char** argv) { return dtrain::apps::ctr_main(argc, argv); }
