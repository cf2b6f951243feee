"""AMP Troubleshooter web app (placeholder until the app issue lands: it only lays out tabs)."""
import gradio as gr

with gr.Blocks(title="AMP Troubleshooter") as demo:
    gr.Markdown("# AMP Troubleshooter\nDiagnose and fix PyTorch FP16/BF16 mixed-precision training.")

if __name__ == "__main__":
    demo.launch(server_name="127.0.0.1")
