package integration

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// This package's own tests call the harness by these names.
var (
	call                 = Call
	text                 = Text
	mustOK               = MustOK
	mustErr              = MustErr
	structured           = Structured
	callAsync            = CallAsync
	awaitCall            = AwaitCall
	waitFor              = WaitFor
	waitForFile          = WaitForFile
	eras                 = Eras
	freePort             = FreePort
	agentBinary          = AgentBinary
	agentTLS             = AgentTLS
	natsSetup            = NATSSetup
	readPub              = ReadPub
	clusterNodeConf      = ClusterNodeConf
	testTLS              = LoopbackTLS
	startNode            = StartNode
	connections          = Connections
	auditRecords         = AuditRecords
	scrape               = Scrape
	capture              = Capture
	next                 = NextMsg
	largeContent         = LargeContent
	waitProcess          = WaitProcess
	writeFile            = WriteFile
	fleetctlBinary       = FleetctlBinary
	hostOnline           = HostOnline
	enrolKey             = EnrolKey
	watchConn            = WatchConn
	gatewayBinary        = GatewayBinary
	gatewayCAPin         = GatewayCAPin
	startGatewayProcess  = StartGatewayProcess
	launchGatewayProcess = LaunchGatewayProcess
)

type (
	progressLog = ProgressLog
	syncBuffer  = SyncBuffer
	watchedConn = WatchedConn
	gatewayProc = GatewayProc
)

const mib = MiB
