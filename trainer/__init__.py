"""VidCluster's DDP video-classification trainer (GluonCV DDP_CONFIG compatible)."""
