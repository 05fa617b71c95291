# Sourced by local-cluster.sh and containers.sh: the one port layout of a Ray node on a shared
# host, so that several nodes share one machine (or its network) and tests find each by its port.
ray_ports() {  # ray_ports GCS_PORT INDEX: the `ray start` options of node INDEX (0: the head)
    # Node INDEX takes the 10 ports above GCS_PORT+10*(INDEX+1) (its node manager's first) and its
    # Ray workers the 100 above GCS_PORT+100*(INDEX+1).
    local base=$(($1 + 10 * ($2 + 1))) lo=$(($1 + 100 * ($2 + 1)))
    echo "--node-ip-address 127.0.0.1 --disable-usage-stats --object-store-memory $((200 * 1024 * 1024))" \
        "--node-manager-port $base --object-manager-port $((base + 1)) --metrics-export-port $((base + 2))" \
        "--dashboard-agent-listen-port $((base + 3)) --dashboard-agent-grpc-port $((base + 4))" \
        "--runtime-env-agent-port $((base + 5)) --min-worker-port $lo --max-worker-port $((lo + 99))"
}
