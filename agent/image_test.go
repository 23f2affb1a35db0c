//go:build unix

package agent

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"image"
	"image/color"
	"image/png"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/image/bmp"
	"golang.org/x/image/tiff"
	"golang.org/x/image/webp"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// writeFile writes data to name under dir and returns its path.
func writeFile(t testing.TB, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// shownResult is an image read's result taken apart.
type shownResult struct {
	note string
	mime string
	data []byte
	info map[string]any
	img  image.Image // data decoded
}

// readImage reads path and checks that the result is a note and an
// image.
func readImage(t *testing.T, tb *toolbox, args map[string]any) shownResult {
	t.Helper()
	res, _ := tbCall(t, context.Background(), tb, "read", args)
	if res.Error != nil || res.IsError {
		t.Fatalf("read %v failed: %v %v", args, res.Error, res.Content)
	}
	if len(res.Content) != 2 || res.Content[0].Type != "text" || res.Content[1].Type != "image" {
		t.Fatalf("read %v gave %d items (%+v), want a note and an image", args, len(res.Content), res.Content)
	}
	s := shownResult{note: res.Content[0].Text, mime: res.Content[1].MIMEType, data: res.Content[1].Data}
	if err := json.Unmarshal(res.Structured, &s.info); err != nil {
		t.Fatalf("structured result %q: %v", res.Structured, err)
	}
	var err error
	switch s.mime {
	case "image/webp":
		s.img, err = webp.Decode(bytes.NewReader(s.data))
	default:
		s.img, _, err = image.Decode(bytes.NewReader(s.data))
	}
	if err != nil {
		t.Fatalf("shown %s does not decode: %v", s.mime, err)
	}
	return s
}

func abs(n int) int { return max(n, -n) }

// readErr reads with args and returns the text of the tool error.
func readErr(t *testing.T, tb *toolbox, args map[string]any) string {
	t.Helper()
	res, _ := tbCall(t, context.Background(), tb, "read", args)
	if !res.IsError || len(res.Content) != 1 {
		t.Fatalf("read %v: want a tool error, got error=%v isError=%v content=%+v", args, res.Error, res.IsError, res.Content)
	}
	return res.Content[0].Text
}

// near reports whether c is within 24 of want on every channel.
func near(c color.Color, want color.NRGBA) bool {
	got := color.NRGBAModel.Convert(c).(color.NRGBA)
	d := func(a, b uint8) bool { return max(a, b)-min(a, b) <= 24 }
	return d(got.R, want.R) && d(got.G, want.G) && d(got.B, want.B) && d(got.A, want.A)
}

func wantContains(t *testing.T, what, s string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(s, w) {
			t.Errorf("%s does not mention %q:\n%s", what, w, s)
		}
	}
}

func TestReadImageAsIs(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	small := encodePNG(t, quadrants(64, 48))
	photo := encodeJPEG(t, quadrants(300, 200), 90)
	upright := withEXIF(photo, exifSegment(1, binary.BigEndian))
	wp := solidWebP(40, 30, color.NRGBA{10, 200, 30, 255})
	if m, err := webp.Decode(bytes.NewReader(wp)); err != nil || m.Bounds().Dx() != 40 || !near(m.At(5, 5), color.NRGBA{10, 200, 30, 255}) {
		t.Fatalf("the test's WebP file does not decode as built: %v", err)
	}
	anim := animatedGIF(t, 32, 16, red, blue)
	tests := []struct {
		name, file string
		data       []byte
		mime       string
		w, h       int
		note       []string
	}{
		{"png", "small.png", small, "image/png", 64, 48, []string{"PNG image, 64x48", "Shown as is: coordinates on it are the file's pixels"}},
		{"png named as text", "shot.txt", small, "image/png", 64, 48, []string{"PNG image, 64x48"}},
		{"jpeg", "photo.jpg", photo, "image/jpeg", 300, 200, []string{"JPEG image, 300x200", "Shown as is"}},
		{"jpeg with orientation 1", "upright.jpg", upright, "image/jpeg", 300, 200, []string{"Shown as is"}},
		{"webp", "pic.webp", wp, "image/webp", 40, 30, []string{"WebP image, 40x30", "Shown as is"}},
		{"animated gif", "anim.gif", anim, "image/gif", 32, 16, []string{"GIF image, 32x16", "Shown as is (animated"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeFile(t, dir, tt.file, tt.data)
			s := readImage(t, tb, map[string]any{"path": p})
			if !bytes.Equal(s.data, tt.data) || s.mime != tt.mime {
				t.Errorf("shown %s of %d bytes, want the file's own %d bytes as %s", s.mime, len(s.data), len(tt.data), tt.mime)
			}
			wantContains(t, "note", s.note, append(tt.note, p, "sha256 "+sha256Hex(tt.data))...)
			if s.info["sha256"] != sha256Hex(tt.data) || s.info["path"] != p || s.info["width"] != float64(tt.w) || s.info["height"] != float64(tt.h) ||
				s.info["scale_x"] != 1.0 || s.info["scale_y"] != 1.0 || s.info["shown"].(map[string]any)["as_is"] != true {
				t.Errorf("structured result = %v", s.info)
			}
		})
	}
}

func TestReadImageEXIFOrientation(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	// A 4000x3000 photo stored on its side: orientation 6 says turn it
	// 90° clockwise. Upright, the stored top left (red) is at the top
	// right, the stored bottom left (blue) at the top left.
	big := withEXIF(encodeJPEG(t, quadrants(4000, 3000), 85), exifSegment(6, binary.BigEndian))
	p := writeFile(t, dir, "side.jpg", big)
	s := readImage(t, tb, map[string]any{"path": p})
	if b := s.img.Bounds(); b.Dx() != 1500 || b.Dy() != 2000 || s.mime != "image/jpeg" {
		t.Fatalf("shown %s %dx%d, want an upright 1500x2000 JPEG", s.mime, b.Dx(), b.Dy())
	}
	for _, q := range []struct {
		x, y int
		c    color.NRGBA
		name string
	}{{375, 500, blue, "top left"}, {1125, 500, red, "top right"}, {1125, 1500, green, "bottom right"}, {375, 1500, white, "bottom left"}} {
		if c := s.img.At(q.x, q.y); !near(c, q.c) {
			t.Errorf("%s quadrant is %v, want %v", q.name, c, q.c)
		}
	}
	wantContains(t, "note", s.note, "JPEG image, 4000x3000", "EXIF orientation 6 was applied: upright it is 3000x4000",
		"Shown as a 1500x2000 JPEG (scaled to fit 2000 px)", "multiply x by 2 and y by 2")
	if s.info["orientation"] != 6.0 || s.info["scale_x"] != 2.0 || s.info["scale_y"] != 2.0 {
		t.Errorf("structured result = %v", s.info)
	}

	// A small photo with an orientation is turned upright too, at its
	// size, rather than passed with its EXIF for the client to apply.
	small := withEXIF(encodeJPEG(t, quadrants(200, 100), 90), exifSegment(3, binary.LittleEndian))
	p = writeFile(t, dir, "upside-down.jpg", small)
	s = readImage(t, tb, map[string]any{"path": p})
	if b := s.img.Bounds(); b.Dx() != 200 || b.Dy() != 100 || bytes.Equal(s.data, small) {
		t.Fatalf("shown %dx%d (as is: %v), want a converted 200x100", b.Dx(), b.Dy(), bytes.Equal(s.data, small))
	}
	if !near(s.img.At(20, 20), white) || !near(s.img.At(180, 80), red) {
		t.Errorf("turned 180°: top left %v, bottom right %v; want white and red", s.img.At(20, 20), s.img.At(180, 80))
	}
	wantContains(t, "note", s.note, "EXIF orientation 3 was applied", "converted, same size")
}

func TestOrient(t *testing.T) {
	// A 3x2 image of pixels 1..6, and how it looks upright under each
	// EXIF orientation (rows top to bottom).
	src := image.NewRGBA(image.Rect(0, 0, 3, 2))
	for i := range 6 {
		src.Pix[i*4] = uint8(i + 1)
	}
	want := map[int][][]uint8{
		1: {{1, 2, 3}, {4, 5, 6}},
		2: {{3, 2, 1}, {6, 5, 4}},
		3: {{6, 5, 4}, {3, 2, 1}},
		4: {{4, 5, 6}, {1, 2, 3}},
		5: {{1, 4}, {2, 5}, {3, 6}},
		6: {{4, 1}, {5, 2}, {6, 3}},
		7: {{6, 3}, {5, 2}, {4, 1}},
		8: {{3, 6}, {2, 5}, {1, 4}},
	}
	for o, rows := range want {
		got := orient(src, o)
		if got.Rect.Dx() != len(rows[0]) || got.Rect.Dy() != len(rows) {
			t.Errorf("orientation %d: %v, want %dx%d", o, got.Rect, len(rows[0]), len(rows))
			continue
		}
		for y, row := range rows {
			for x, v := range row {
				if g := got.Pix[got.PixOffset(x, y)]; g != v {
					t.Errorf("orientation %d: pixel (%d,%d) = %d, want %d", o, x, y, g, v)
				}
			}
		}
	}
}

func TestReadImageConverted(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	pic := quadrants(120, 80)
	var bm, tf bytes.Buffer
	if err := bmp.Encode(&bm, pic); err != nil {
		t.Fatal(err)
	}
	if err := tiff.Encode(&tf, pic, nil); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, file, label string
		data              []byte
	}{{"bmp", "pic.bmp", "BMP", bm.Bytes()}, {"tiff", "pic.tif", "TIFF", tf.Bytes()}} {
		t.Run(tt.name, func(t *testing.T) {
			p := writeFile(t, dir, tt.file, tt.data)
			s := readImage(t, tb, map[string]any{"path": p})
			if s.mime != "image/png" || s.img.Bounds() != pic.Bounds() {
				t.Fatalf("shown %s %v, want a PNG of %v", s.mime, s.img.Bounds(), pic.Bounds())
			}
			for y := range 80 {
				for x := range 120 {
					if g, w := color.NRGBAModel.Convert(s.img.At(x, y)), pic.At(x, y); g != w {
						t.Fatalf("pixel (%d,%d) = %v, want %v: the conversion must be lossless", x, y, g, w)
					}
				}
			}
			wantContains(t, "note", s.note, tt.label+" image, 120x80", "Shown as a 120x80 PNG (converted, same size)")
			if s.info["format"] != tt.name || s.info["shown"].(map[string]any)["format"] != "png" {
				t.Errorf("structured result = %v", s.info)
			}
		})
	}
}

func TestReadImageScaled(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd

	// Transparency stays: PNG.
	translucent := solid(2500, 100, color.NRGBA{0, 0, 255, 128})
	s := readImage(t, tb, map[string]any{"path": writeFile(t, dir, "wide.png", encodePNG(t, translucent))})
	if s.mime != "image/png" || s.img.Bounds().Dx() != 2000 || s.img.Bounds().Dy() != 80 || !near(s.img.At(1000, 40), color.NRGBA{0, 0, 255, 128}) {
		t.Errorf("translucent 2500x100 PNG shown as %s %v, centre %v", s.mime, s.img.Bounds(), s.img.At(1000, 40))
	}
	wantContains(t, "note", s.note, "Shown as a 2000x80 PNG (scaled to fit 2000 px)", "multiply x by 1.25 and y by 1.25")

	// An opaque PNG over the size limit becomes a JPEG.
	s = readImage(t, tb, map[string]any{"path": writeFile(t, dir, "tall.png", encodePNG(t, quadrants(1000, 3000)))})
	if s.mime != "image/jpeg" || s.img.Bounds().Dx() != 667 || s.img.Bounds().Dy() != 2000 || !near(s.img.At(100, 100), red) || !near(s.img.At(600, 1900), white) {
		t.Errorf("opaque 1000x3000 PNG shown as %s %v", s.mime, s.img.Bounds())
	}
	if sx, sy := s.info["scale_x"].(float64), s.info["scale_y"].(float64); sx < 1.49 || sx > 1.5 || sy != 1.5 {
		t.Errorf("scale %v x %v, want about 1.5", sx, sy)
	}

	// An animated GIF that must shrink shows its first frame.
	s = readImage(t, tb, map[string]any{"path": writeFile(t, dir, "anim.gif", animatedGIF(t, 4000, 40, red, blue))})
	if s.img.Bounds().Dx() != 2000 || s.img.Bounds().Dy() != 20 || !near(s.img.At(1000, 10), red) {
		t.Errorf("animated 4000x40 GIF shown as %s %v, centre %v", s.mime, s.img.Bounds(), s.img.At(1000, 10))
	}
	wantContains(t, "note", s.note, "only its first frame is shown")
}

func TestReadImageByteLimit(t *testing.T) {
	tb := tbNew(t)
	tb.cfg.ImageMaxBytes = 60_000
	dir := tb.cfg.Cwd
	// Within the dimension limit but not the byte limit: quality, then
	// size, steps down until it fits.
	file := encodePNG(t, noise(800, 600, 1))
	s := readImage(t, tb, map[string]any{"path": writeFile(t, dir, "noise.png", file)})
	if n := base64.StdEncoding.EncodedLen(len(s.data)); n > 60_000 || s.mime != "image/jpeg" {
		t.Errorf("shown %s of %d bytes base64-encoded, want a JPEG within 60000", s.mime, n)
	}
	if b := s.img.Bounds(); b.Dx() >= 800 || abs(b.Dx()*3-b.Dy()*4) > 4 {
		t.Errorf("shown %v, want smaller than 800x600 and 4:3", b)
	}
	wantContains(t, "note", s.note, "PNG image, 800x600", "once base64-encoded", "multiply x by")

	// Over both limits, the note names both.
	tb.cfg.ImageMaxDimension = 700
	s = readImage(t, tb, map[string]any{"path": filepath.Join(dir, "noise.png")})
	if b := s.img.Bounds(); b.Dx() >= 700 || base64.StdEncoding.EncodedLen(len(s.data)) > 60_000 {
		t.Errorf("shown %v in %d bytes, want under 700 px wide and 60000 bytes base64-encoded", b, len(s.data))
	}
	wantContains(t, "note", s.note, "scaled to fit 700 px and 58.6KB once base64-encoded")

	tb.cfg.ImageMaxBytes = 1 << 10
	msg := readErr(t, tb, map[string]any{"path": filepath.Join(dir, "noise.png")})
	wantContains(t, "error", msg, "noise.png", "even at", "over the 1.0KB limit", "binary_base64")
}

func TestReadImageRefused(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	still := encodePNG(t, quadrants(20, 20))
	anim := apng(still)
	if _, err := png.DecodeConfig(bytes.NewReader(anim)); err != nil {
		t.Fatalf("the test's APNG file is not a valid PNG: %v", err)
	}
	// An IHDR that claims 20000x20000 (400 megapixels), then the end.
	ihdr := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 20000), 20000)
	huge := append([]byte("\x89PNG\r\n\x1a\n"), pngChunk("IHDR", append(ihdr, 8, 6, 0, 0, 0))...)
	huge = append(huge, pngChunk("IEND", nil)...)
	broken := append([]byte("\x89PNG\r\n\x1a\n"), "not really a PNG at all, just bytes"...)

	tests := []struct {
		name string
		data []byte
		args map[string]any
		want []string
	}{
		{"animated png", anim, nil, []string{"animated PNG (APNG)", "binary_base64=true", "ffmpeg"}},
		{"too many pixels", huge, nil, []string{"20000x20000 pixels (400.0 megapixels)", "up to 100 megapixels", "binary_base64=true"}},
		{"broken", broken, nil, []string{"looks like a PNG image by its first bytes", "binary_base64=true"}},
		{"offset on an image", still, map[string]any{"offset": 2}, []string{"is a PNG image; offset, limit and anchor apply to text lines only"}},
		{"anchor on an image", still, map[string]any{"anchor": "x"}, []string{"is a PNG image; offset, limit and anchor apply to text lines only"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeFile(t, dir, strings.ReplaceAll(tt.name, " ", "-")+".png", tt.data)
			args := map[string]any{"path": p}
			for k, v := range tt.args {
				args[k] = v
			}
			wantContains(t, "error", readErr(t, tb, args), append(tt.want, p)...)
		})
	}

	tb.cfg.BinaryMaxBytes = 100
	wantContains(t, "error", readErr(t, tb, map[string]any{"path": writeFile(t, dir, "still.png", still)}),
		"is a PNG image of", "read takes images up to 100B", "--binary_max_bytes")
}

func TestReadSniffsContentNotName(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	for _, text := range []string{"just text, named like an image\n", "BMW and BM: a text file that starts like a BMP\n", "GIF"} {
		p := writeFile(t, dir, "fake.png", []byte(text))
		if got := tbText(t, readCall(t, tb, map[string]any{"path": p})); got != text {
			t.Errorf("text in a .png file read as %q, want %q", got, text)
		}
	}
	// A binary file that is no image is still refused as binary.
	p := writeFile(t, dir, "blob.png", []byte("\x00\x01\x02 not an image"))
	wantContains(t, "error", readErr(t, tb, map[string]any{"path": p}), "is a binary file")
}

// readCall runs read with args on tb.
func readCall(t *testing.T, tb *toolbox, args map[string]any) *protocol.Result {
	t.Helper()
	res, _ := tbCall(t, context.Background(), tb, "read", args)
	return res
}

func TestReadBinaryBase64(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	r := rand.New(rand.NewPCG(7, 7))
	blob := make([]byte, 100_000)
	for i := range blob {
		blob[i] = uint8(r.Uint32())
	}
	pic := encodePNG(t, quadrants(10, 10))
	for _, tt := range []struct {
		name string
		data []byte
	}{{"binary", blob}, {"image, unprocessed", pic}, {"text", []byte("plain text\n")}, {"empty", nil}} {
		t.Run(tt.name, func(t *testing.T) {
			p := writeFile(t, dir, "f-"+strings.Fields(tt.name)[0], tt.data)
			res := readCall(t, tb, map[string]any{"path": p, "binary_base64": true})
			if res.IsError || res.Error != nil || len(res.Content) != 2 || res.Content[1].Type != "text" {
				t.Fatalf("result = %+v", res)
			}
			got, err := base64.StdEncoding.DecodeString(res.Content[1].Text)
			if err != nil || !bytes.Equal(got, tt.data) {
				t.Fatalf("base64 content decodes to %d bytes (%v), want the file's %d", len(got), err, len(tt.data))
			}
			wantContains(t, "note", res.Content[0].Text, p, "sha256 "+sha256Hex(tt.data), "base64")
			var info map[string]any
			if err := json.Unmarshal(res.Structured, &info); err != nil || info["sha256"] != sha256Hex(tt.data) || info["bytes"] != float64(len(tt.data)) {
				t.Errorf("structured result %s (%v)", res.Structured, err)
			}
		})
	}

	tb.cfg.BinaryMaxBytes = 99_999
	wantContains(t, "error", readErr(t, tb, map[string]any{"path": filepath.Join(dir, "f-binary"), "binary_base64": true}),
		"is 97.7KB (100000 bytes)", "files up to 97.7KB (99999 bytes", "--binary_max_bytes")
	wantContains(t, "error", readErr(t, tb, map[string]any{"path": dir, "binary_base64": true}), "is a directory")
	wantContains(t, "error", readErr(t, tb, map[string]any{"path": filepath.Join(dir, "nope"), "binary_base64": true}), "no such file")
	wantContains(t, "error", readErr(t, tb, map[string]any{"path": filepath.Join(dir, "f-text"), "binary_base64": true, "limit": 3}),
		"offset, limit and anchor apply to text lines only")
}

// TestImageResultCrossesWire checks that an image result of about 4 MB
// survives the wire form and its split into parts unchanged.
func TestImageResultCrossesWire(t *testing.T) {
	tb := tbNew(t)
	tb.cfg.ImageMaxBytes = 6_000_000
	// 1340x1000 of noise is about 4 MB as PNG: within the limits, so it
	// passes as is.
	file := encodePNG(t, noise(1340, 1000, 3))
	if len(file) < 4_000_000 || base64.StdEncoding.EncodedLen(len(file)) > tb.cfg.ImageMaxBytes {
		t.Fatalf("test image is %d bytes; want about 4 MB", len(file))
	}
	res, _ := tbCall(t, context.Background(), tb, "read", map[string]any{"path": writeFile(t, tb.cfg.Cwd, "big.png", file)})
	wire, err := protocol.EncodeResult(res)
	if err != nil {
		t.Fatal(err)
	}
	// As publishResult sends it and the gateway reassembles it: frames
	// through their wire form, into an Assembly.
	parts, err := protocol.Split(wire, protocol.ChunkSize)
	if err != nil {
		t.Fatal(err)
	}
	asm := protocol.NewAssembly(64 << 20)
	for i, p := range parts {
		h, body := protocol.Frame{Kind: protocol.KindResult, CallID: "call-1", Seq: uint64(i + 1), Part: i + 1, Parts: len(parts), Data: p}.Encode()
		f, err := protocol.DecodeFrame(h, body)
		if err != nil {
			t.Fatal(err)
		}
		done, err := asm.Add(f)
		if err != nil || done != (i == len(parts)-1) {
			t.Fatalf("part %d of %d: done %v, %v", i+1, len(parts), done, err)
		}
	}
	back, err := protocol.DecodeResult(asm.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Content) != 2 || back.Content[1].MIMEType != "image/png" || !bytes.Equal(back.Content[1].Data, file) ||
		back.Content[0].Text != res.Content[0].Text || !bytes.Equal(back.Structured, res.Structured) {
		t.Fatalf("result changed on the wire: %d items, %s", len(back.Content), back.Content[0].Text)
	}
	t.Logf("%d-byte result in %d parts", len(wire), len(parts))
}

func TestMediaLimitsConfig(t *testing.T) {
	for _, tt := range []struct {
		cfg  toolboxConfig
		want string
	}{
		{toolboxConfig{ImageMaxDimension: 8}, "image max dimension 8 is below 16"},
		{toolboxConfig{ImageMaxBytes: -1}, "image max bytes -1 is below 1024"},
		{toolboxConfig{BinaryMaxBytes: -5}, "binary max bytes -5 must be positive"},
		{toolboxConfig{BinaryMaxBytes: 100 << 20}, "--binary_max_bytes"},
		{toolboxConfig{ImageMaxBytes: 128 << 20}, "--image_max_bytes"},
	} {
		if err := tt.cfg.setMediaDefaults(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("setMediaDefaults(%+v) = %v, want %q", tt.cfg, err, tt.want)
		}
	}
	var c toolboxConfig
	if err := c.setMediaDefaults(); err != nil || c.ImageMaxDimension != 2000 || c.ImageMaxBytes != 4_500_000 || c.BinaryMaxBytes != 20<<20 {
		t.Errorf("defaults: %+v, %v", c, err)
	}
}

// BenchmarkReadImage measures a read of a 4000x3000 photo-like JPEG
// (smooth gradients with fine detail): decode, scale to 2000x1500,
// encode.
func BenchmarkReadImage(b *testing.B) {
	m := image.NewNRGBA(image.Rect(0, 0, 4000, 3000))
	r := rand.New(rand.NewPCG(1, 2))
	for y := range 3000 {
		for x := range 4000 {
			i := m.PixOffset(x, y)
			v := uint8((x/7 + y/5) % 256)
			m.Pix[i], m.Pix[i+1], m.Pix[i+2], m.Pix[i+3] = v, uint8(r.IntN(40))+v/2, uint8(x), 255
		}
	}
	file := encodeJPEG(b, m, 90)
	tb := tbNewB(b)
	p := writeFile(b, tb.cfg.Cwd, "photo.jpg", file)
	args, _ := json.Marshal(map[string]any{"path": p})
	b.Logf("file %s", humanSize(int64(len(file))))
	b.ReportAllocs()
	// CPU time as well as wall time: on a shared machine the wall time
	// mostly measures the neighbours.
	before := cpuTime(b)
	for b.Loop() {
		res := tb.read(context.Background(), &toolCall{ID: "c", Args: args, Output: func([]byte) {}})
		if res.IsError || len(res.Content) != 2 {
			b.Fatalf("read failed: %+v", res.Content)
		}
	}
	b.ReportMetric(float64((cpuTime(b)-before).Milliseconds())/float64(b.N), "cpu-ms/op")
}

// cpuTime returns the process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// tbNewB is tbNew for benchmarks.
func tbNewB(b *testing.B) *toolbox {
	tb, err := newToolbox(toolboxConfig{Cwd: b.TempDir(), StateDir: filepath.Join(b.TempDir(), "state"), Shell: "/bin/sh",
		BashDefaultTimeout: 1, BashMaxTimeout: 1})
	if err != nil {
		b.Fatal(err)
	}
	return tb
}

// FuzzProbeImage feeds arbitrary bytes to what read does with a file
// that looks like an image: sniffing, the header decoders behind
// DecodeConfig, the APNG, GIF and WebP animation checks and the EXIF
// parsers. It must never panic, must allocate little, and what it accepts
// must respect the pixel limit; small images it accepts also go through
// the conversion with small limits.
func FuzzProbeImage(f *testing.F) {
	pic := quadrants(12, 8)
	f.Add(encodePNG(f, pic))
	f.Add(apng(encodePNG(f, pic)))
	f.Add(withEXIF(encodeJPEG(f, pic, 80), exifSegment(6, binary.BigEndian)))
	f.Add(animatedGIF(f, 6, 4, red, blue))
	f.Add(solidWebP(5, 3, green))
	var bm bytes.Buffer
	if err := bmp.Encode(&bm, pic); err != nil {
		f.Fatal(err)
	}
	f.Add(bm.Bytes())
	var tf bytes.Buffer
	if err := tiff.Encode(&tf, pic, nil); err != nil {
		f.Fatal(err)
	}
	f.Add(tf.Bytes())
	lim := imageLimits{maxDim: 16, maxEncoded: 4 << 10, maxPixels: 1 << 12}
	f.Fuzz(func(t *testing.T, data []byte) {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		before := ms.TotalAlloc
		p, err := probeImage("f", data, lim.maxPixels)
		runtime.ReadMemStats(&ms)
		// The decoders' own tables and buffers (a JPEG decoder is about
		// 100 KB) and a copy of the file at most: never the canvas the
		// header claims.
		if n := ms.TotalAlloc - before; n > 1<<20+2*uint64(len(data)) {
			t.Fatalf("probing %d bytes allocated %d bytes", len(data), n)
		}
		if err != nil {
			return
		}
		if p.width <= 0 || p.height <= 0 || int64(p.width)*int64(p.height) > lim.maxPixels || p.orientation < 1 || p.orientation > 8 {
			t.Fatalf("probe accepted %+v", p)
		}
		s, err := convertImage(t.Context(), "f", data, p, lim)
		if err != nil {
			return
		}
		if max(s.width, s.height) > lim.maxDim || len(s.data) == 0 {
			t.Fatalf("converted to %dx%d, %d bytes, over the limits %+v", s.width, s.height, len(s.data), lim)
		}
	})
}

// TestReadMediaGuarded: binary_base64 and images go through the same
// checks as text: the host policy and the agent's own files, also under
// another name.
func TestReadMediaGuarded(t *testing.T) {
	g := tbPolicy(t, `paths: {deny: ["**/private/**"]}`)
	hard := filepath.Join(g.cwd, "hard")
	if err := os.Link(g.secret, hard); err != nil {
		t.Fatal(err)
	}
	pic := encodePNG(t, quadrants(4, 4))
	if err := os.MkdirAll(filepath.Join(g.cwd, "private"), 0o755); err != nil {
		t.Fatal(err)
	}
	private := writeFile(t, g.cwd, "private/pic.png", pic)
	for _, tt := range []struct {
		name string
		args map[string]any
		want string
	}{
		{"credentials", map[string]any{"path": g.secret, "binary_base64": true}, "its credentials"},
		{"credentials under another name", map[string]any{"path": hard, "binary_base64": true}, "credentials under another name"},
		{"image in a denied directory", map[string]any{"path": private}, "private"},
		{"raw bytes in a denied directory", map[string]any{"path": private, "binary_base64": true}, "private"},
	} {
		wantDenied(t, tt.name, run(t, g.toolbox, "read", tt.args), tt.want)
	}
}

// TestReadImageConcurrentAndCancelled: conversions wait their turn, and
// a call cancelled while it waits ends at once.
func TestReadImageConcurrentAndCancelled(t *testing.T) {
	tb := tbNew(t)
	var bm bytes.Buffer
	if err := bmp.Encode(&bm, quadrants(300, 200)); err != nil {
		t.Fatal(err)
	}
	p := writeFile(t, tb.cfg.Cwd, "pic.bmp", bm.Bytes())
	args, _ := json.Marshal(map[string]any{"path": p})

	var wg sync.WaitGroup
	results := make([]*protocol.Result, 4)
	for i := range results {
		wg.Go(func() {
			results[i] = tb.read(context.Background(), &toolCall{ID: "c", Args: args, Output: func([]byte) {}})
		})
	}
	wg.Wait()
	for i, r := range results {
		if r.IsError || r.Error != nil || len(r.Content) != 2 || r.Content[1].MIMEType != "image/png" {
			t.Errorf("concurrent read %d: %+v", i, r)
		}
	}

	tb.imageSem <- struct{}{} // a conversion in progress
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan *protocol.Result)
	go func() { done <- tb.read(ctx, &toolCall{ID: "c", Args: args, Output: func([]byte) {}}) }()
	select {
	case r := <-done:
		t.Fatalf("read finished while another conversion held the turn: %+v", r)
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	select {
	case r := <-done:
		if r.Error == nil || r.Error.Code != protocol.CodeCancelled {
			t.Errorf("cancelled read = %+v, want a cancelled error", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("cancelled read still waiting")
	}
	<-tb.imageSem
}
