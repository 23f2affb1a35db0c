package load

import (
	"os"
	"testing"

	"github.com/fleetmcp/fleetmcp/integration"
)

func TestMain(m *testing.M) { os.Exit(integration.Main(m)) }
