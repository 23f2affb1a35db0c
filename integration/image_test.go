package integration

import (
	"bytes"
	"encoding/base64"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/agent"
)

// TestReadImages reads images and raw bytes through the whole path: the
// go-sdk client, the gateway's schema and result conversion, NATS parts
// under a small max_payload, and the agent.
func TestReadImages(t *testing.T) {
	env := NewEnv(t, Options{MaxPayload: 64 << 10, Agent: func(c *agent.Config) { c.ImageMaxDimension = 500 }})
	dir := env.AgentDir("alpha")

	// A 300x200 PNG of noise (about 180 KB): within the limits, so the
	// client gets the file's own bytes.
	r := rand.New(rand.NewPCG(1, 1))
	m := image.NewNRGBA(image.Rect(0, 0, 300, 200))
	for i := range m.Pix {
		m.Pix[i] = uint8(r.Uint32()) | 0x80
	}
	var pngFile bytes.Buffer
	if err := png.Encode(&pngFile, m); err != nil {
		t.Fatal(err)
	}
	writeAgentFile(t, dir, "shot.txt", pngFile.Bytes()) // named as text: content decides
	// A 1000x400 opaque image: over the host's 500 px, so shown scaled.
	big := image.NewRGBA(image.Rect(0, 0, 1000, 400))
	for i := range big.Pix {
		big.Pix[i] = 200
	}
	var jpgFile bytes.Buffer
	if err := jpeg.Encode(&jpgFile, big, nil); err != nil {
		t.Fatal(err)
	}
	writeAgentFile(t, dir, "wide.jpg", jpgFile.Bytes())

	for _, era := range eras {
		t.Run(era.Name, func(t *testing.T) {
			cs := env.Client(era.Version, nil)

			res := call(t, cs, "read", map[string]any{"host": "alpha", "path": "shot.txt"})
			img := imageContent(t, res)
			if img.MIMEType != "image/png" || !bytes.Equal(img.Data, pngFile.Bytes()) {
				t.Fatalf("image content %s of %d bytes, want the file's %d bytes as image/png", img.MIMEType, len(img.Data), pngFile.Len())
			}
			if !strings.Contains(text(res), "PNG image, 300x200") {
				t.Errorf("note = %q", text(res))
			}
			if s := structured(t, res); s["format"] != "png" || len(s["sha256"].(string)) != 64 {
				t.Errorf("structured = %v", s)
			}

			res = call(t, cs, "read", map[string]any{"host": "alpha", "path": "wide.jpg"})
			img = imageContent(t, res)
			cfg, err := jpeg.DecodeConfig(bytes.NewReader(img.Data))
			if err != nil || cfg.Width != 500 || cfg.Height != 200 {
				t.Fatalf("scaled image %dx%d (%v), want 500x200", cfg.Width, cfg.Height, err)
			}
			if c := color.GrayModel.Convert(mustDecode(t, img.Data).At(250, 100)).(color.Gray); c.Y < 190 || c.Y > 210 {
				t.Errorf("scaled image centre %v, want grey 200", c)
			}
			if !strings.Contains(text(res), "multiply x by 2 and y by 2") {
				t.Errorf("note = %q", text(res))
			}

			res = call(t, cs, "read", map[string]any{"host": "alpha", "path": "wide.jpg", "binary_base64": true})
			mustOK(t, res)
			if len(res.Content) != 2 {
				t.Fatalf("binary_base64 gave %d content items, want 2", len(res.Content))
			}
			raw, err := base64.StdEncoding.DecodeString(res.Content[1].(*mcp.TextContent).Text)
			if err != nil || !bytes.Equal(raw, jpgFile.Bytes()) {
				t.Fatalf("binary_base64 decodes to %d bytes (%v), want the file's %d", len(raw), err, jpgFile.Len())
			}
		})
	}
}

func writeAgentFile(t *testing.T, dir, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// imageContent returns the image of a successful result made of a note
// and an image.
func imageContent(t *testing.T, res *mcp.CallToolResult) *mcp.ImageContent {
	t.Helper()
	mustOK(t, res)
	if len(res.Content) != 2 {
		t.Fatalf("result has %d content items, want a note and an image", len(res.Content))
	}
	img, ok := res.Content[1].(*mcp.ImageContent)
	if !ok {
		t.Fatalf("second content item is %T, want *mcp.ImageContent", res.Content[1])
	}
	return img
}

func mustDecode(t *testing.T, data []byte) image.Image {
	t.Helper()
	m, err := jpeg.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	return m
}
