package shardgatetest

import (
	"context"
	"strings"
	"testing"
)

// The main module does not link the Docker backend: choosing it says which module to import,
// and starts nothing.
func TestDockerNeedsItsModule(t *testing.T) {
	set, err := StartShards(context.Background(), Docker, 1)
	if err == nil {
		set.Close()
		t.Fatal("StartShards(Docker) started without the container module")
	}
	for _, want := range []string{"go get " + ContainerModule, `import _ "` + ContainerModule + `"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("StartShards(Docker): %v\nwant %q", err, want)
		}
	}
}
