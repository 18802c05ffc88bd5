// dtrain-seg JOB.toml [-o key=value]...                        train (once per worker)
// dtrain-seg predict JOB.toml IMAGE... --output DIR            predicted masks as palette PNGs
// dtrain-seg export JOB.toml --output DIR [--split S] [--count N]   scenes as a PaddleSeg data set
//
// Data-parallel semantic segmentation (U-Net or PP-LiteSeg-style models on
// scenes composed from Fashion-MNIST, or PaddleSeg list files). Started by
// `dtrain apps/seg.toml` once per worker.

#include "seg/seg.h"

int main(int argc, char** argv) { return dtrain::apps::seg_main(argc, argv); }
