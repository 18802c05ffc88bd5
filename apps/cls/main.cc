// dtrain-cls JOB.toml [-o key=value]...
//
// Data-parallel image classification (ResNet family on Fashion-MNIST or a
// PaddleClas list file). Started by `dtrain JOB.toml` once per worker, or by
// hand / torchrun-style variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

#include "cls/cls.h"

int main(int argc, char** argv) { return dtrain::apps::cls_main(argc, argv); }
