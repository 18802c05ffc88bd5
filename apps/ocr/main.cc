// dtrain-ocr JOB.toml [-o key=value]...                          train (once per worker)
// dtrain-ocr predict JOB.toml IMAGE... [--list FILE]             recognised text of each image
// dtrain-ocr render JOB.toml --output DIR [--split S] [--count N]   rendered words as a PaddleOCR list
//
// Data-parallel text recognition (CRNN + CTC on words rendered with FreeType,
// or PaddleOCR recognition lists). Started by `dtrain apps/ocr.toml` once per worker.

#include "ocr/ocr.h"

int main(int argc, char** argv) { return dtrain::apps::ocr_main(argc, argv); }
