"""Files in and out: HugeCTR sparse-model folders, keyset files, .npy pairs; bulk import."""
