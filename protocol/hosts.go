package protocol

// HostsBucket is the JetStream key-value bucket in which gateway replicas
// share what they know about each host (key: the host ID; value: its last
// announce and when it was last seen). Like the audit trail it is not part
// of the agent contract: agents have no JetStream permissions.
const HostsBucket = "fleet_hosts"
