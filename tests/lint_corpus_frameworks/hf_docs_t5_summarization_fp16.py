# The transformers docs' summarization fine-tuning (tasks/summarization): T5 with fp16=True
# Source: written for this corpus the way huggingface/transformers docs/source/en/tasks/summarization.md writes it (Apache-2.0)
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, Seq2SeqTrainer, Seq2SeqTrainingArguments

checkpoint = "google-t5/t5-small"
tokenizer = AutoTokenizer.from_pretrained(checkpoint)
model = AutoModelForSeq2SeqLM.from_pretrained(checkpoint)

training_args = Seq2SeqTrainingArguments(
    output_dir="my_awesome_billsum_model",
    eval_strategy="epoch",
    learning_rate=2e-5,
    per_device_train_batch_size=16,
    per_device_eval_batch_size=16,
    weight_decay=0.01,
    save_total_limit=3,
    num_train_epochs=4,
    predict_with_generate=True,
    fp16=True,
)
trainer = Seq2SeqTrainer(model=model, args=training_args, processing_class=tokenizer)
trainer.train()
